"""scripts/bench_training_step.py runs end to end (one round, no compile): every variant is timed on
the synthetic batch and on a real Multi30k batch, with the committed benchmark's tokenizer; and its
speed ladder (--ladder) runs on the CPU with a tiny model, reporting every row, those that cannot
run here as skipped with the reason. The README's speed table comes from full runs of the same command."""
import argparse
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from transformer_lib.data import multi30k_dir
from transformer_lib.device import cpu_has_native_bf16
from transformer_lib.model import TransformerConfig, build_transformer
from transformer_lib.training import LabelSmoothingLoss, translation_loss

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "bench_training_step.py"
EAGER_VARIANTS = ["peer fp32", "ours fp32", "ours bf16", "ours bf16, paper dropout",
                  "ours bf16, paper dropout, explicit attention", "ours bf16, Multi30k table's dropout, explicit attention"]
LADDER = ["float32", "mixed precision", "no host syncs", "fused Adam", "torch.compile", "CUDA graphs", "larger batch"]
RAN_KEYS = {"tokens_per_s", "step_ms", "tflops", "share_of_peak", "syncs_per_step", "batches", "target_tokens",
            "padded_tokens", "first_pass_s", "speed_x_first_row"}


def _data_dir() -> Path:
    return multi30k_dir() or REPO.parent / "shared" / "data" / "multi30k"


def test_bench_training_step_smoke_run():
    data_dir = _data_dir()
    command = [sys.executable, str(SCRIPT), "--data-dir", str(data_dir),
               "--repeats", "1", "--warmup", "1", "--real-batches", "1", "--no-compile", "--device", "cpu",
               "--max-tokens", "512", "--matmul-size", "512",   # small: this checks the tables, not the speed
               "--threads", "1", "--synthetic-threads", "1"]   # one thread: the test command's workers share the cores
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    tables = [line.split(" | ")[0].removeprefix("| ") for line in done.stdout.splitlines()
              if line.startswith("| ") and not line.startswith("| variant")]
    expected_tables = 2 if data_dir.is_dir() else 1          # the real batches need Multi30k
    assert tables == EAGER_VARIANTS * expected_tables


def test_ladder_smoke_run_on_the_cpu(tmp_path):
    out = tmp_path / "ladder.json"
    command = [sys.executable, str(SCRIPT), "--ladder", "--device", "cpu", "--model", "tiny", "--no-compile",
               "--data-dir", str(_data_dir()), "--repeats", "1", "--warmup", "1", "--real-batches", "2",
               "--max-tokens", "128", "--larger-batch", "2", "--matmul-size", "128", "--threads", "1",
               "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {row["row"]: row for row in report["rows"]}
    assert [row["row"] for row in report["rows"]] == LADDER
    assert report["device"] == "cpu" and report["cuda"] is None and report["model"] == "tiny"
    assert report["data"] == ("multi30k" if _data_dir().is_dir() else "synthetic")
    mixed = "bf16" if cpu_has_native_bf16() else None          # never bf16 by emulation
    assert set(report["matmul_peak_tflops"]) == {"float32", mixed} - {None}
    # Rows that cannot run on a CPU, or were left out, are reported as skipped with the reason.
    assert rows["CUDA graphs"] == {"row": "CUDA graphs", "change": {"compile": "reduce-overhead", "static": True},
                                   "amp": mixed or "float32", "status": "skipped",
                                   "reason": "CUDA graphs need a CUDA device"}
    assert (rows["torch.compile"]["status"], rows["torch.compile"]["reason"]) == ("skipped", "left out by --no-compile")
    ran = [row for row in report["rows"] if row["status"] == "ran"]
    expected = ["float32", "mixed precision", "no host syncs", "fused Adam", "larger batch"]
    if mixed is None:
        assert rows["mixed precision"]["reason"] == "no mixed precision on cpu (no bf16 instructions)"
        expected.remove("mixed precision")
    assert [row["row"] for row in ran] == expected
    peak = max(report["matmul_peak_tflops"].values())
    for row in ran:
        assert RAN_KEYS <= set(row), row
        assert row["tokens_per_s"] > 0 and row["step_ms"] > 0 and row["syncs_per_step"] is None   # counted on CUDA
        assert row["share_of_peak"] == pytest.approx(row["tflops"] / peak, rel=0.05, abs=1e-3)
    assert [row["amp"] for row in ran] == ["float32"] + [mixed or "float32"] * (len(ran) - 1)   # rows build up
    assert rows["float32"]["batches"] == 2 and rows["larger batch"]["batches"] == 1   # 2x the tokens a batch
    assert rows["float32"]["speed_x_first_row"] == 1.0
    printed = [line.split(" | ")[0].removeprefix("| ") for line in done.stdout.splitlines()
               if line.startswith("| ") and not line.startswith("| row")]
    assert printed == LADDER


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ladder_smoke_run_on_cuda(tmp_path):
    """Every row runs on a GPU, compiled and CUDA-graphed ones included, and dropping the host syncs shows."""
    out = tmp_path / "ladder.json"
    command = [sys.executable, str(SCRIPT), "--ladder", "--device", "cuda", "--model", "tiny",
               "--data-dir", str(_data_dir()), "--repeats", "1", "--warmup", "2", "--real-batches", "2",
               "--max-tokens", "256", "--larger-batch", "2", "--matmul-size", "1024", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["row"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == LADDER
    assert {name: row.get("reason") for name, row in rows.items() if row["status"] != "ran"} == {}
    mixed = "bf16" if torch.cuda.get_device_capability() >= (8, 0) else "fp16"
    assert [row["amp"] for row in rows.values()] == ["float32"] + [mixed] * 6
    assert all(RAN_KEYS <= set(row) and isinstance(row["syncs_per_step"], int) for row in rows.values())
    assert rows["float32"]["syncs_per_step"] > 0                 # .item(), the token counts
    assert rows["no host syncs"]["syncs_per_step"] < rows["mixed precision"]["syncs_per_step"]


@pytest.mark.parametrize("args, message", [
    (["--device", "gpu"], "--device 'gpu' is not a device"),
    (["--ladder", "--larger-batch", "0"], "--larger-batch must be a positive int, got 0"),
    pytest.param(["--device", "cuda"], "--device cuda: no CUDA device is visible here", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="needs a machine without CUDA")),
])
def test_bad_arguments_are_one_error_line(args, message):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {message}") and len(done.stderr.splitlines()) == 1


def _script():
    spec = importlib.util.spec_from_file_location("bench_training_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_static_shape_padding_changes_no_loss():
    """The CUDA-graph row pads every batch to one shape, with rows of padding only: the loss stays the same."""
    script = _script()
    config = TransformerConfig(50, 50, 16, 2, 32, 1, 1, 0.0, norm_first=True, pad_id=0)
    batch = script.synthetic_batches(config, B=4, S=6, T=5)[0]
    padded = script.pad_to_shape(batch, B=7, S=9, T=8)
    assert padded.src.shape == (7, 9) and padded.tgt_in.shape == (7, 8)
    assert padded.n_target_tokens == batch.n_target_tokens
    assert padded.src_key_padding_mask[4:].all() and padded.tgt_key_padding_mask[:, 5:].all()
    torch.manual_seed(0)
    model = build_transformer(config).eval()
    criterion = LabelSmoothingLoss(0.1, ignore_index=0)
    with torch.no_grad():
        expected, _ = translation_loss(model, batch, criterion)
        loss, _ = translation_loss(model, padded, criterion)
    torch.testing.assert_close(loss, expected)


def test_ladder_rows_skip_what_the_device_lacks():
    script = _script()
    cpu, start = torch.device("cpu"), dict(script.START)
    mps, graphs = torch.device("mps"), {"compile": "reduce-overhead", "static": True}
    assert script.why_not({**start, "amp": None}, {"amp": "auto"}, mps, False) == "no mixed precision on mps"
    assert script.why_not({**start, "amp": None}, {"amp": "auto"}, cpu, False) == \
        "no mixed precision on cpu (no bf16 instructions)"
    assert script.why_not({**start, "amp": "bf16"}, {"amp": "auto"}, cpu, False) is None
    assert script.why_not(start, graphs, cpu, False) == "CUDA graphs need a CUDA device"
    assert script.why_not(start, {"compile": "default"}, cpu, True) == "left out by --no-compile"
    assert script.why_not(start, {"compile": "default"}, cpu, False) is None
    assert script.why_not(start, {"fused": True}, cpu, False) is None        # fused Adam runs on a CPU (torch >= 2.4)


def test_ladder_builds_on_the_last_row_that_ran(monkeypatch):
    """Each row adds its change to the last row that ran; a row that fails is reported, not carried on."""
    script, tried = _script(), []

    def fake_run_row(args, config, weights, settings, device, data, peak):
        tried.append(dict(settings))
        if settings["fused"]:
            raise RuntimeError("CUDA out of memory.\nTried to allocate ...")
        return {"status": "ran", "tokens_per_s": 100.0 * len(tried), "step_ms": 1.0, "tflops": 0.1,
                "share_of_peak": 0.5, "syncs_per_step": None}

    def no_data(*args, **kwargs):
        raise FileNotFoundError("no Multi30k here")

    monkeypatch.setattr(script, "run_row", fake_run_row)
    monkeypatch.setattr(script, "load_pairs", no_data)
    monkeypatch.setattr(script, "cpu_has_native_bf16", lambda: True)
    args = argparse.Namespace(model="tiny", matmul_size=64, data_dir="none", max_tokens=128, repeats=1, warmup=1,
                              larger_batch=3, no_compile=False, real_batches=2)
    report = script.ladder(args, torch.device("cpu"), types.SimpleNamespace(vocab_size=50, pad_id=0))
    rows = {row["row"]: row for row in report["rows"]}
    assert {name: row["status"] for name, row in rows.items()} == {
        "float32": "ran", "mixed precision": "ran", "no host syncs": "ran", "fused Adam": "failed",
        "torch.compile": "ran", "CUDA graphs": "skipped", "larger batch": "ran"}
    assert rows["fused Adam"]["reason"] == "RuntimeError: CUDA out of memory."
    assert report["data"] == "synthetic"
    assert [t["fused"] for t in tried] == [False, False, False, True, False, False]   # not carried past its failure
    assert tried[-1] == {"amp": "bf16", "syncs": False, "fused": False, "compile": "default", "static": False,
                         "batch_factor": 3}
    assert rows["larger batch"]["speed_x_first_row"] == 6.0                    # 600 / 100 tokens/s
