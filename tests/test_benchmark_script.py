"""scripts/benchmark_multi30k.py runs end to end on the real Multi30k files (a few steps, a few
test sentences): both models train, are scored, and the report is assembled. The full run is one
command in README.md; its committed results are checked by tests/test_results.py."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.reference_weights import DEVICE
from transformer_lib.data import multi30k_dir
from transformer_lib.device import pick_amp
from transformer_lib.multihead import MultiHeadAttention

REPO = Path(__file__).resolve().parent.parent


@DEVICE
def test_benchmark_smoke_run(tmp_path, device):
    data_dir = multi30k_dir() or REPO.parent / "shared" / "data" / "multi30k"
    if not data_dir.is_dir():
        pytest.skip("Multi30k is not available here (set MULTI30K_DIR)")
    out = tmp_path / "results"
    command = [sys.executable, str(REPO / "scripts" / "benchmark_multi30k.py"), "--data-dir", str(data_dir),
               "--out", str(out), "--weights-dir", str(tmp_path / "runs"), "--max-steps", "4", "--budget", "10m",
               "--average-every", "2", "--ours-average", "2", "--ours-cooldown", "0.5", "--test-limit", "3", "--log-every", "2", "--validate-every", "4", "--d-model", "32",
               "--d-ff", "64", "--layers", "1", "--vocab-size", "1000", "--threads", "1", "--no-progress", "--device", device]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    ours, peer = metrics["models"]["ours"], metrics["models"]["peer"]
    assert ours["steps"] == peer["steps"] == 4
    assert ours["recipe"]["averaged_steps"] == [2, 4] and peer["recipe"]["average_last"] == 0
    assert ours["recipe"]["kept"] in ("last_weights", "averaged_weights") and peer["recipe"]["cooldown"] == 0
    assert ours["history"][-1]["lr"] == 0.0       # the cooldown ends the schedule at 0 (max-steps 4, cooldown 0.5)
    assert [h["step"] for h in ours["history"] if "valid_loss" in h] == [4]
    if device == "cpu":   # --ours-amp auto: bf16 only if a few timed steps on this machine say it is faster
        assert ours["recipe"]["amp"] in ("bf16", None)
        assert set(ours["recipe"]["amp_probe_seconds"]) == {"float32", "bf16"}
    else:                 # on a GPU, what it has: bf16 on capability >= 8.0, fp16 below
        assert ours["recipe"]["amp"] == pick_amp(device) and "amp_probe_seconds" not in ours["recipe"]
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


@pytest.mark.parametrize("device, message", [
    ("gpu", "--device 'gpu' is not a device; use cpu, cuda, cuda:N or mps"),
    ("cpu --ours-amp fp16", "fp16 autocast (with its GradScaler) needs a CUDA device, not --device cpu"),
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


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("benchmark", REPO / "scripts" / "benchmark_multi30k.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_attention_init_like_torch_draws_what_nn_multihead_attention_draws():
    init_attention_like_torch = _benchmark_module().init_attention_like_torch
    ours, theirs = MultiHeadAttention(32, 4), nn.MultiheadAttention(32, 4)
    out_weight = ours.out_proj.weight.detach().clone()
    torch.manual_seed(7)
    init_attention_like_torch(ours)
    torch.manual_seed(7)
    theirs._reset_parameters()        # Xavier on the packed (3D, D) in_proj_weight first, then zero biases
    packed = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
    torch.testing.assert_close(packed, theirs.in_proj_weight, rtol=0, atol=0)
    assert packed.abs().max() <= (6 / (4 * 32)) ** 0.5     # the bound of a 3D x D matrix, not of D x D
    for proj in (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj):
        assert torch.count_nonzero(proj.bias) == 0
    torch.testing.assert_close(ours.out_proj.weight, out_weight, rtol=0, atol=0)   # W^O keeps its D x D Xavier
