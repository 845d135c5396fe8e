"""The committed Multi30k results (results/multi30k/seed_*/ and summary.json, written by
scripts/benchmark_multi30k.py) must agree with each other and with the documents that quote them: a
score in metrics.json is re-derived here from the committed translations, the summary's means from
the seeds' metrics, and docs/results.md's table and the README's headline from the summary, so no
number can be edited by hand without this failing."""
import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from transformer_lib.data import load_pairs, multi30k_dir
from transformer_lib.evaluation import score_translations

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "multi30k"
RESULTS_PAGE = REPO / "docs" / "results.md"   # the full table, linked from the README
SEEDS = sorted(p.name for p in RESULTS.glob("seed_*") if (p / "metrics.json").is_file())
pytestmark = pytest.mark.skipif(not SEEDS, reason="no committed Multi30k results")
DECODINGS = [(split, decoding) for split in ("test_2016", "test_2017") for decoding in ("greedy", "beam4")]


def load_metrics(seed: str) -> dict:
    return json.loads((RESULTS / seed / "metrics.json").read_text())


@pytest.fixture(scope="module")
def summary() -> dict:
    return json.loads((RESULTS / "summary.json").read_text())


def test_two_seeds_committed():
    assert SEEDS == ["seed_0", "seed_1"]


@pytest.mark.parametrize("seed", SEEDS)
def test_metrics_name_both_models_and_full_test_sets(seed):
    metrics = load_metrics(seed)
    assert set(metrics["models"]) == {"ours", "peer"}
    assert metrics["data"]["train_pairs"] == 29000
    assert metrics["data"]["test_2016_pairs"] == 1000 and metrics["data"]["test_2017_pairs"] == 1000
    for result in metrics["models"].values():
        assert result["command"].startswith("python scripts/benchmark_multi30k.py")
        if "--valid-only" in result["command"]:   # trained without a test set: the test scores come from --eval-only
            assert "--eval-only" in result["eval_command"]
            assert f"--seed {result['config']['seed']}" in result["eval_command"]
        assert result["config"]["seed"] == int(seed.removeprefix("seed_"))
        assert result["steps"] > 0 and result["train_seconds"] > 0 and result["target_tokens_per_second"] > 0
        assert result["history"][-1]["step"] <= result["steps"]
        assert any("valid_loss" in h for h in result["history"])     # the curves show validation loss
        for split in ("test_2016", "test_2017"):
            assert {"greedy", "beam4"} <= set(result["test"][split])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("model", ["ours", "peer"])
def test_per_model_file_matches_metrics(seed, model):
    assert json.loads((RESULTS / seed / f"model_{model}.json").read_text()) == load_metrics(seed)["models"][model]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("model", ["ours", "peer"])
@pytest.mark.parametrize("split, decoding", DECODINGS)
def test_scores_recomputed_from_committed_hypotheses(seed, model, split, decoding):
    # The references are read from the local Multi30k copy, never committed.
    data_dir = multi30k_dir() or REPO.parent / "shared" / "data" / "multi30k"
    if not data_dir.is_dir():
        pytest.skip("Multi30k is not available here (set MULTI30K_DIR)")
    references = [t for _, t in load_pairs("multi30k", split, data_dir=data_dir)]
    hypotheses = (RESULTS / seed / f"hypotheses_{model}_{split}_{decoding}.txt").read_text(encoding="utf-8")
    hypotheses = hypotheses.split("\n")[:-1]
    assert len(hypotheses) == len(references) == 1000
    recomputed = score_translations(hypotheses, references)
    stored = load_metrics(seed)["models"][model]["test"][split][decoding]
    for name in ("bleu", "chrf", "bleu_lowercase"):
        assert round(recomputed[name], 2) == stored[name], name


@pytest.mark.parametrize("seed", SEEDS)
def test_training_time_within_the_stated_budget(seed):
    for result in load_metrics(seed)["models"].values():
        budget = result["config"]["budget"]
        assert result["train_seconds"] >= budget * 0.97          # the budget was used (less the autocast probe) ...
        assert result["train_seconds"] <= budget + 60            # ... and not exceeded by more than a step


@pytest.mark.parametrize("seed", SEEDS)
def test_side_by_side_shares_data_budget_architecture_and_machine(seed):
    ours, peer = load_metrics(seed)["models"]["ours"], load_metrics(seed)["models"]["peer"]
    shared = ("budget", "vocab_size", "d_model", "heads", "d_ff", "layers", "dropout", "label_smoothing",
              "max_tokens", "warmup", "lr_factor", "seed", "threads")
    assert {k: ours["config"][k] for k in shared} == {k: peer["config"][k] for k in shared}
    assert ours["config"]["model"] == peer["config"]["model"]
    assert ours["parameters"] == peer["parameters"]
    # the same machine; a record made before the script wrote the device down (the peer's runs) was a CPU's.
    # How malloc was set is the process's, not the machine's: a record made before the script set it (the
    # peer's runs) ran with malloc as it is; docs/results.md says what the setting changed.
    def machine(result: dict) -> dict:
        return {"device": "cpu"} | {k: v for k, v in result["hardware"].items() if k != "malloc_keeps_freed"}
    assert machine(ours) == machine(peer)
    # The peer keeps the standard recipe; only ours averages checkpoints (and they are the last ones).
    assert peer["recipe"]["amp"] is None and peer["recipe"]["average_last"] == 0
    averaged = ours["recipe"].get("averaged_steps", [])
    assert len(averaged) == ours["recipe"]["average_last"] and (not averaged or averaged[-1] == ours["steps"])


@pytest.mark.parametrize("seed", SEEDS)
def test_figures_exist(seed):
    samples = (RESULTS / seed / "samples.md").read_text()
    assert "ours:" in samples and "peer:" in samples
    for name in ("curves.png", "attention.png"):
        assert (RESULTS / seed / name).stat().st_size > 10_000


def test_summary_is_the_mean_of_the_seeds(summary):
    spec = importlib.util.spec_from_file_location("benchmark", REPO / "scripts" / "benchmark_multi30k.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    assert summary["seeds"] == [int(s.removeprefix("seed_")) for s in SEEDS]
    for model in ("ours", "peer"):
        per_seed = {str(int(s.removeprefix("seed_"))): benchmark.seed_scores(load_metrics(s)["models"][model])
                    for s in SEEDS}
        assert summary["models"][model]["per_seed"] == per_seed
        for key, value in summary["models"][model]["mean"].items():
            assert value == round(statistics.fmean(s[key] for s in per_seed.values()), 2), (model, key)


def test_results_page_quotes_the_summary(summary):
    """docs/results.md's Multi30k table: a row per model and seed, and the mean row, as summary.json says."""
    columns = ["steps", "target_tokens_per_second", "valid_greedy", "valid_beam4", "beam4_alpha"] + [
        f"{s}_{d}" for s, d in DECODINGS]
    rows = {}
    for line in RESULTS_PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if cells[0] in ("ours", "`nn.Transformer`") and len(cells) == 2 + len(columns):
            rows["ours" if cells[0] == "ours" else "peer", cells[1]] = cells[2:]
    expected = {(m, label) for m in ("ours", "peer") for label in [*summary["models"][m]["per_seed"], "mean"]}
    assert set(rows) == expected, "docs/results.md's Multi30k table lacks rows: one per model and seed, and the mean"
    for (model, label), cells in rows.items():
        stored = summary["models"][model]["mean"] if label == "mean" else summary["models"][model]["per_seed"][label]
        quoted = [float(c.replace(",", "")) for c in cells]
        assert quoted == [round(stored[key], 0 if i < 2 else 1) for i, key in enumerate(columns)], (model, label)


def test_readme_headline_quotes_the_summary(summary):
    """The README's one-line Multi30k result: ours with beam 4 and greedy, then the peer's, on test_2016."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ours, peer = summary["models"]["ours"]["mean"], summary["models"]["peer"]["mean"]
    headline = (f"{ours['test_2016_beam4']:.2f} BLEU with beam 4 on test_2016 ({ours['test_2016_greedy']:.2f} greedy), "
                f"against {peer['test_2016_beam4']:.2f} / {peer['test_2016_greedy']:.2f} for `nn.Transformer`")
    assert headline in " ".join(readme.split())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("split, sentences", [("valid", 1014), ("test_2016", 1000)])
def test_evaluate_run_reproduced_the_table(seed, split, sentences):
    """evaluate_{valid,test_2016}_beam4.json: `evaluate --run` on ours' run folder scored the validation set
    and test_2016 with beam 4 and the α chosen on the validation set, as the table does, so the numbers come
    from the product's own command, not only from the benchmark's decoding."""
    record = json.loads((RESULTS / seed / f"evaluate_{split}_beam4.json").read_text())
    assert record["command"].startswith("python -m transformer_lib evaluate --run ")
    ours = load_metrics(seed)["models"]["ours"]
    alpha = ours["length_penalty"]["alpha"]
    assert f"--split {split} --beam 4 --alpha {alpha:g} " in record["command"]
    assert record["output"]["sentences"] == sentences and record["output"]["beam"] == 4
    stored = ours["length_penalty"]["valid_bleu"][f"{alpha:g}"] if split == "valid" else \
        ours["test"][split]["beam4"]["bleu"]
    assert round(record["output"]["bleu"], 2) == stored


AUTO_RECORDS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "results").glob("**/evaluate_test_2016_beam4_auto.json"))


def test_some_run_was_scored_with_alpha_auto():
    assert AUTO_RECORDS


@pytest.mark.parametrize("path", AUTO_RECORDS)
def test_evaluate_alpha_auto_chose_as_the_benchmark_did(path):
    """evaluate_test_2016_beam4_auto.json (beside a run's model_ours.json: a committed seed's, or a replaced
    one's under multi30k_trials): `evaluate --run ... --alpha auto` chose the benchmark's α from the same
    validation scores (both call choose_alpha) and scored test_2016 as the benchmark did."""
    record = json.loads((REPO / path).read_text())
    assert record["command"].startswith("python -m transformer_lib evaluate --run ")
    assert " --split test_2016 --beam 4 --alpha auto " in record["command"]
    ours, output = json.loads((REPO / path).with_name("model_ours.json").read_text()), record["output"]
    assert output["alpha"] == ours["length_penalty"]["alpha"]
    assert output["alpha_valid_bleu"] == ours["length_penalty"]["valid_bleu"]
    assert output["sentences"] == 1000 and round(output["bleu"], 2) == ours["test"]["test_2016"]["beam4"]["bleu"]


@pytest.mark.parametrize("seed", SEEDS)
def test_both_models_chose_alpha_the_same_way(seed):
    """The same decoding rule for both: beam 4, α from the same candidates, each model the one its own
    validation BLEU ranked first (the first of equals)."""
    models = load_metrics(seed)["models"]
    assert list(models["ours"]["length_penalty"]["valid_bleu"]) == list(models["peer"]["length_penalty"]["valid_bleu"])
    for result in models.values():
        penalty = result["length_penalty"]
        assert penalty["beam"] == 4
        best = max(penalty["valid_bleu"].values())
        assert f"{penalty['alpha']:g}" == next(a for a, bleu in penalty["valid_bleu"].items() if bleu == best)
