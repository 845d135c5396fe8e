"""The committed Multi30k results (results/multi30k/, written by scripts/benchmark_multi30k.py)
must agree with each other: a score in metrics.json is re-derived here from the committed
translations, so a number can't be edited by hand without this failing."""
import json
from pathlib import Path

import pytest

from transformer_lib.data import load_pairs, multi30k_dir
from transformer_lib.evaluation import score_translations

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "multi30k"
pytestmark = pytest.mark.skipif(not (RESULTS / "metrics.json").is_file(), reason="no committed Multi30k results")


@pytest.fixture(scope="module")
def metrics() -> dict:
    return json.loads((RESULTS / "metrics.json").read_text())


def test_metrics_name_both_models_and_full_test_sets(metrics):
    assert set(metrics["models"]) == {"ours", "peer"}
    assert metrics["data"]["train_pairs"] == 29000
    assert metrics["data"]["test_2016_pairs"] == 1000 and metrics["data"]["test_2017_pairs"] == 1000
    for result in metrics["models"].values():
        assert result["command"].startswith("python scripts/benchmark_multi30k.py")
        assert result["steps"] > 0 and result["train_seconds"] > 0 and result["target_tokens_per_second"] > 0
        assert result["history"][-1]["step"] <= result["steps"]
        for split in ("test_2016", "test_2017"):
            assert {"greedy", "beam4"} <= set(result["test"][split])


@pytest.mark.parametrize("model", ["ours", "peer"])
def test_per_model_file_matches_metrics(metrics, model):
    assert json.loads((RESULTS / f"model_{model}.json").read_text()) == metrics["models"][model]


@pytest.mark.parametrize("model", ["ours", "peer"])
@pytest.mark.parametrize("split", ["test_2016", "test_2017"])
@pytest.mark.parametrize("decoding", ["greedy", "beam4"])
def test_scores_recomputed_from_committed_hypotheses(metrics, model, split, decoding):
    # The references are read from the local Multi30k copy, never committed.
    data_dir = multi30k_dir() or REPO.parent / "shared" / "data" / "multi30k"
    if not data_dir.is_dir():
        pytest.skip("Multi30k is not available here (set MULTI30K_DIR)")
    references = [t for _, t in load_pairs("multi30k", split, data_dir=data_dir)]
    hypotheses = (RESULTS / f"hypotheses_{model}_{split}_{decoding}.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hypotheses) == len(references) == 1000
    recomputed = score_translations(hypotheses, references)
    stored = metrics["models"][model]["test"][split][decoding]
    for name in ("bleu", "chrf", "bleu_lowercase"):
        assert round(recomputed[name], 2) == stored[name], name


def test_training_time_within_the_stated_budget(metrics):
    for result in metrics["models"].values():
        budget = result["config"]["budget"]
        assert result["train_seconds"] >= budget * 0.99          # the budget was used ...
        assert result["train_seconds"] <= budget + 60            # ... and not exceeded by more than a step


def test_side_by_side_shares_data_budget_architecture_and_machine(metrics):
    ours, peer = metrics["models"]["ours"], metrics["models"]["peer"]
    shared = ("budget", "vocab_size", "d_model", "heads", "d_ff", "layers", "dropout", "label_smoothing",
              "max_tokens", "warmup", "lr_factor", "seed", "threads")
    assert {k: ours["config"][k] for k in shared} == {k: peer["config"][k] for k in shared}
    assert ours["config"]["model"] == peer["config"]["model"]
    assert ours["parameters"] == peer["parameters"]
    assert ours["hardware"] == peer["hardware"]
    # The peer keeps the standard recipe; only ours averages checkpoints (and they are the last ones).
    assert peer["recipe"]["amp"] is None and peer["recipe"]["average_last"] == 0
    averaged = ours["recipe"].get("averaged_steps", [])
    assert len(averaged) == ours["recipe"]["average_last"] and (not averaged or averaged[-1] == ours["steps"])


def test_figures_exist():
    assert "ours:" in (RESULTS / "samples.md").read_text() and "peer:" in (RESULTS / "samples.md").read_text()
    for name in ("curves.png", "attention.png"):
        assert (RESULTS / name).stat().st_size > 10_000


def test_readme_quotes_the_committed_numbers(metrics):
    """README's Multi30k table (rows `| ours |` and `| nn.Transformer |`) says what metrics.json says."""
    rows = {}
    for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("ours", "`nn.Transformer`") and len(cells) == 8:
            rows["ours" if cells[0] == "ours" else "peer"] = cells
    assert set(rows) == {"ours", "peer"}, "README.md lacks the Multi30k table rows"
    for model, cells in rows.items():
        result = metrics["models"][model]
        assert int(cells[2].replace(",", "")) == result["steps"]
        assert int(cells[3].replace(",", "")) == result["target_tokens_per_second"]
        quoted = [float(c) for c in cells[4:8]]
        stored = [result["test"][split][decoding]["bleu"] for split in ("test_2016", "test_2017")
                  for decoding in ("greedy", "beam4")]
        assert quoted == [round(s, 1) for s in stored], model
