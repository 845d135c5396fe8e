"""scripts/benchmark_multi30k.py runs end to end on a slice of the real Multi30k files (a few steps, a
few test sentences): ours trains through the product's `train_run` into a run folder that `evaluate
--run` and `translate --run` open and score as the script did, the peer in its own loop on the same
batches from the same tokenizer, both are scored, and the report is assembled. The full run is one
command in docs/results.md; its committed results are checked by tests/test_results.py."""
import gzip
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_cli_errors import cli
from tests.reference_weights import DEVICE
from transformer_lib.data import multi30k_dir
from transformer_lib.device import pick_amp

REPO = Path(__file__).resolve().parent.parent
# How many pairs of each Multi30k file the slice keeps: enough for a vocabulary of 1,000 and a few batches.
SLICE = {"train": 2000, "val": 60, "test_2016_flickr": 20, "test_2017_flickr": 20}


@pytest.fixture(scope="module")
def multi30k_slice(tmp_path_factory) -> Path:
    """The first pairs of each real Multi30k file, as a Multi30k folder (the full BPE and validation set would
    take most of the smoke run's time and test nothing more)."""
    data_dir = multi30k_dir() or REPO.parent / "shared" / "data" / "multi30k"
    if not data_dir.is_dir():
        pytest.skip("Multi30k is not available here (set MULTI30K_DIR)")
    folder = tmp_path_factory.mktemp("multi30k")
    for stem, count in SLICE.items():
        for lang in ("de", "en"):
            with gzip.open(data_dir / f"{stem}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(count)]
            with gzip.open(folder / f"{stem}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.writelines(lines)
    return folder


SMOKE = ["--max-steps", "10", "--budget", "10m", "--average-every", "5", "--ours-average", "2", "--ours-cooldown", "0.5",
         "--test-limit", "3", "--log-every", "5", "--validate-every", "10", "--d-model", "32", "--d-ff", "64",
         "--layers", "1", "--vocab-size", "1000", "--no-progress"]


@DEVICE
def test_benchmark_smoke_run(tmp_path, device, multi30k_slice):
    out = tmp_path / "results"
    command = [sys.executable, str(REPO / "scripts" / "benchmark_multi30k.py"), "--data-dir", str(multi30k_slice),
               "--out", str(out), "--weights-dir", str(tmp_path / "runs"), *SMOKE, "--threads", "1", "--device", device]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    ours, peer = metrics["models"]["ours"], metrics["models"]["peer"]
    assert ours["steps"] == peer["steps"] == 10
    assert ours["recipe"]["averaged_steps"] == [5, 10] and peer["recipe"]["average_last"] == 0
    assert ours["recipe"]["kept"] in ("last_weights", "averaged_weights") and peer["recipe"]["cooldown"] == 0
    assert ours["recipe"]["init"] == "torch" and ours["recipe"]["attention"] == "fused"
    assert ours["history"][-1]["lr"] == 0.0       # the cooldown ends the schedule at 0 (max-steps 10, cooldown 0.5)
    assert [h["step"] for h in ours["history"] if "valid_loss" in h] == [10]
    if device == "cpu":   # --ours-amp auto: bf16 only where timed steps say it is faster; not timed for 10 steps
        assert ours["recipe"]["amp"] is None
    else:                 # on a GPU, what it has: bf16 on capability >= 8.0, fp16 below
        assert ours["recipe"]["amp"] == pick_amp(device)
        assert (ours["hardware"]["gpu"], ours["hardware"]["cuda"]) == (torch.cuda.get_device_name(), torch.version.cuda)
    assert set(ours["valid_greedy"]) == {"last_weights", "averaged_weights"} and set(peer["valid_greedy"]) == {
        "last_weights"}
    for result in (ours, peer):
        assert {"greedy", "beam4"} <= set(result["test"]["test_2016"]) and "bleu" in result["test"]["test_2017"]["greedy"]
    assert len((out / "hypotheses_peer_test_2017_beam4.txt").read_text().splitlines()) == 3
    for name in ("curves.png", "attention.png", "samples.md", "tokenizer.json"):
        assert (out / name).is_file(), name
    assert ours["hardware"]["device"] == device and ours["config"]["device"] == device
    assert peer["recipe"]["amp"] is None                  # --peer-amp none: the peer's float32 recipe
    # Ours is a run folder of the product: `evaluate --run` scores it as the script did, `translate` opens it.
    run = out / "runs" / "ours"
    assert ours["run"] == str(run) and ours["train_command"].startswith(f"python -m transformer_lib train --run {run} ")
    for result in (ours, peer):   # α chosen on the (3) validation sentences from the default candidates
        penalty = result["length_penalty"]
        assert penalty["beam"] == 4 and list(penalty["valid_bleu"]) == ["0.6", "0.8", "1", "1.2", "1.4", "1.6",
                                                                         "1.8", "2"]
        assert penalty["valid_bleu"][f"{penalty['alpha']:g}"] == max(penalty["valid_bleu"].values())
    alpha = str(ours["length_penalty"]["alpha"])
    for split in ("test_2016", "test_2017"):
        scored = cli("evaluate", "--run", run, "--split", split, "--beam", "4", "--alpha", alpha, "--limit", "3",
                     "--device", device)
        assert scored.returncode == 0, scored.stderr
        assert round(json.loads(scored.stdout)["bleu"], 2) == ours["test"][split]["beam4"]["bleu"]
    hypotheses = (out / "hypotheses_ours_test_2016_greedy.txt").read_text(encoding="utf-8").splitlines()
    sources = [line.strip() for line in gzip.open(multi30k_slice / "test_2016_flickr.de.gz", "rt", encoding="utf-8")]
    translated = cli("translate", "--run", run, "--device", device, *sources[:3])
    assert translated.returncode == 0 and translated.stdout.splitlines() == hypotheses, translated.stderr
    drawn = cli("translate", "--run", run, "--device", device, "--attention", tmp_path / "map.png", sources[0])
    assert drawn.returncode == 0 and (tmp_path / "map.png").is_file(), drawn.stderr
    # Both models' processes let malloc keep freed blocks on a CPU (as `train` does), nowhere else.
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert ours["hardware"]["malloc_keeps_freed"] is (device == "cpu" and glibc)
    # --assemble: the files copied elsewhere (ours' run folder too) give the same record, ours' run path updated.
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    (moved / "metrics.json").unlink()
    assembled = subprocess.run([*command[:command.index("--out") + 1], str(moved), *command[command.index("--out") + 2:],
                                "--assemble"], capture_output=True, text=True, timeout=600)
    assert assembled.returncode == 0, assembled.stderr[-3000:]
    again = json.loads((moved / "metrics.json").read_text())["models"]
    assert again["peer"] == peer and again["ours"]["run"] == str(moved / "runs" / "ours")
    assert again["ours"]["train_command"] == ours["train_command"].replace(str(run), str(moved / "runs" / "ours"))
    assert {k: v for k, v in again["ours"].items() if k not in ("run", "train_command")} == {
        k: v for k, v in ours.items() if k not in ("run", "train_command")}


def test_ours_and_the_peer_draw_the_same_batches(tmp_path, monkeypatch, multi30k_slice):
    """The peer's batches (the script's own TranslationData) hold the token ids of ours' (the one
    `train_run` builds), epoch after epoch, from the same tokenizer."""
    from transformer_lib import data as data_module
    from transformer_lib.files import fingerprint_tokenizer
    from transformer_lib.runs import RunFolder
    from transformer_lib.train_run import train_run
    benchmark = _benchmark_module()
    args = benchmark.build_parser().parse_args(["--data-dir", str(multi30k_slice), *SMOKE, "--max-steps", "1"])
    _, _, _, tokenizer, _, peer_data = benchmark.shared_data(args)
    built = []

    class Recorded(data_module.TranslationData):
        def __init__(self, *arguments, **options):
            super().__init__(*arguments, **options)
            built.append(self)
    monkeypatch.setattr(data_module, "TranslationData", Recorded)
    settings = benchmark.ours_settings(args)
    train_run(tmp_path / "run", settings, announce=False)
    assert RunFolder(tmp_path / "run").read().tokenizer.fingerprint == fingerprint_tokenizer(tokenizer.tokenizer.to_str())
    ours_data = built[0]                                # the training pairs' (the validation pairs' come next)
    for epoch in (0, 1):
        ours, peer = ours_data.batches(epoch, seed=settings.seed), peer_data.batches(epoch, seed=args.seed)
        assert len(ours) == len(peer) > 10
        for a, b in zip(ours, peer):
            assert torch.equal(a.src, b.src) and torch.equal(a.tgt_in, b.tgt_in) and torch.equal(a.tgt_out, b.tgt_out)


def test_the_benchmark_recipe_is_a_train_command():
    """The recorded train command, parsed by `train`, gives the settings ours trained with (its defaults:
    the table's model)."""
    from transformer_lib.cli import build_parser, settings_from
    from transformer_lib.options import train_command
    benchmark = _benchmark_module()
    settings = benchmark.ours_settings(benchmark.build_parser().parse_args(["--data-dir", "/data/multi30k"]))
    words = train_command(settings, "runs/multi30k")
    assert settings_from(build_parser().parse_args(words[3:])) == settings
    assert (settings.init, settings.average, settings.average_every, settings.attention) == ("torch", 5, 100, "auto")
    assert (settings.vocab_size, settings.d_model, settings.heads, settings.d_ff, settings.layers) == (8000, 256, 4, 1024, 3)
    assert (settings.attention_dropout, settings.activation_dropout, settings.max_tokens, settings.time_budget) == (
        None, 0.0, 2048, 1800)           # attention weights: the dropout, 0.1; feed-forward hidden units: none
    recipe = benchmark.recipe_for("ours", benchmark.build_parser().parse_args(["--ours-dropout", "0.2"]))
    assert (recipe["dropout"], recipe["attention_dropout"], recipe["activation_dropout"]) == (0.2, 0.2, 0.0)
    recipe = benchmark.recipe_for("ours", benchmark.build_parser().parse_args(
        ["--ours-dropout", "0.2", "--ours-activation-dropout", "0.1"]))
    assert (recipe["attention_dropout"], recipe["activation_dropout"]) == (0.2, 0.1)


def test_results_page_gives_the_benchmarks_train_command():
    """docs/results.md's `train` command is the one the benchmark records for its defaults (seed 0, 2 threads)."""
    import shlex
    from transformer_lib.options import train_command
    benchmark = _benchmark_module()
    args = benchmark.build_parser().parse_args(["--data-dir", "/data/multi30k", "--threads", "2", "--no-progress"])
    words = train_command(benchmark.ours_settings(args), "runs/multi30k_seed0")
    expected = shlex.join(words).replace("/data/multi30k", "PATH/TO/multi30k").replace(" --no-progress", "")
    assert expected in (REPO / "docs" / "results.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("device, message", [
    ("gpu", "--device 'gpu' is not a device; use cpu, cuda, cuda:N or mps"),
    ("cpu --ours-amp fp16", "fp16 autocast (with its GradScaler) needs a CUDA device, not --device cpu"),
    ("cpu --assemble --valid-only", "--assemble rebuilds a run's test-set record: leave out --valid-only and --eval-only"),
    ("cpu --default-malloc", "--default-malloc needs --models peer: ours trains through `train`, which lets malloc"),
    pytest.param("cuda", "--device cuda: no CUDA device is visible here", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="needs a machine without CUDA")),
])
def test_benchmark_refuses_a_device_it_cannot_use(tmp_path, device, message):
    command = [sys.executable, str(REPO / "scripts" / "benchmark_multi30k.py"), "--device", *device.split(),
               "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {message}") and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()                # refused before anything was written


def test_alpha_candidates_default_to_the_librarys():
    from transformer_lib.evaluation import ALPHA_CANDIDATES
    parser = _benchmark_module().build_parser()
    assert parser.parse_args([]).alpha == list(ALPHA_CANDIDATES) == parser.parse_args(["--alpha", "auto"]).alpha
    assert parser.parse_args(["--alpha", "1.4"]).alpha == [1.4]
    assert parser.parse_args(["--alpha", "0.6,1"]).alpha == [0.6, 1.0]


@pytest.mark.parametrize("given, said", [
    ("0.6,x", "must be a finite number >= 0 (e.g. 0.6), such numbers separated by commas to choose from on the "
              "validation set (e.g. 0.6,1.0,1.4), or auto; got '0.6,x'"),
    ("0.6,11", "alpha must be a finite number in [-10, 10] (the paper uses 0.6; 0 ranks by log P alone; beyond, "
               "length all but decides the ranking), got 11.0"),
    ("nan", "must be a finite number >= 0 (e.g. 0.6), such numbers separated by commas to choose from on the "
            "validation set (e.g. 0.6,1.0,1.4), or auto; got 'nan'"),
])
def test_a_bad_alpha_is_refused_in_one_line(capsys, given, said):
    with pytest.raises(SystemExit) as ended:
        _benchmark_module().build_parser().parse_args(["--alpha", given])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: argument --alpha: {said}")


@pytest.mark.parametrize("stopped_in", ["ours", "the peer"])
def test_an_interrupted_benchmark_says_how_to_go_on(tmp_path, monkeypatch, capsys, stopped_in):
    """The interruptions run_script receives (Ctrl-C anywhere; a kill while ours trains, which train_run turns
    into TrainingStopped) end the script with one line and 128 + the signal, not a traceback; where train_run
    saved ours, the line names its run folder and the command that resumes it."""
    import signal
    from transformer_lib.train_signals import TrainingStopped
    benchmark = _benchmark_module()

    def interrupted():
        if stopped_in == "the peer":
            raise KeyboardInterrupt
        stop = TrainingStopped(signal.SIGTERM, step=700)
        stop.run = tmp_path / "runs" / "ours"
        raise stop
    monkeypatch.setattr(benchmark, "main", interrupted)
    monkeypatch.setattr(sys, "argv", ["scripts/benchmark_multi30k.py", "--seed", "0"])
    with pytest.raises(SystemExit) as ended:
        benchmark.run_script()
    said = capsys.readouterr().err
    assert len(said.splitlines()) == 1 and "Traceback" not in said
    assert said.rstrip().endswith("scripts/benchmark_multi30k.py --seed 0")
    if stopped_in == "ours":
        assert ended.value.code == 128 + signal.SIGTERM
        assert said.startswith(f"interrupted at step 700: saved {tmp_path / 'runs' / 'ours'}")
    else:
        assert ended.value.code == 128 + signal.SIGINT and said.startswith("interrupted; run the same command")


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("benchmark", REPO / "scripts" / "benchmark_multi30k.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
