"""scripts/benchmark_multi30k.py runs end to end on the real Multi30k files (a few steps, a few
test sentences): both models train, are scored, and the report is assembled. The full run is one
command in README.md; its committed results are checked by tests/test_results.py."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_lib.data import multi30k_dir

REPO = Path(__file__).resolve().parent.parent


def test_benchmark_smoke_run(tmp_path):
    data_dir = multi30k_dir() or REPO.parent / "shared" / "data" / "multi30k"
    if not data_dir.is_dir():
        pytest.skip("Multi30k is not available here (set MULTI30K_DIR)")
    out = tmp_path / "results"
    command = [sys.executable, str(REPO / "scripts" / "benchmark_multi30k.py"), "--data-dir", str(data_dir),
               "--out", str(out), "--weights-dir", str(tmp_path / "runs"), "--max-steps", "4", "--budget", "10m",
               "--average-every", "2", "--ours-average", "2", "--ours-cooldown", "0.5", "--test-limit", "3", "--log-every", "2", "--validate-every", "4", "--d-model", "32",
               "--d-ff", "64", "--layers", "1", "--vocab-size", "1000", "--threads", "1", "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    ours, peer = metrics["models"]["ours"], metrics["models"]["peer"]
    assert ours["steps"] == peer["steps"] == 4
    assert ours["recipe"]["averaged_steps"] == [2, 4] and peer["recipe"]["average_last"] == 0
    assert ours["recipe"]["kept"] in ("last_weights", "averaged_weights") and peer["recipe"]["cooldown"] == 0
    assert ours["history"][-1]["lr"] == 0.0       # the cooldown ends the schedule at 0 (max-steps 4, cooldown 0.5)
    assert [h["step"] for h in ours["history"] if "valid_loss" in h] == [4]
    # --ours-amp auto: bf16 only if a few timed steps on this machine say it is faster
    assert ours["recipe"]["amp"] in ("bf16", None) and set(ours["recipe"]["amp_probe_seconds"]) == {"float32", "bf16"}
    assert set(ours["valid_greedy"]) == {"last_weights", "averaged_weights"} and set(peer["valid_greedy"]) == {
        "last_weights"}
    for result in (ours, peer):
        assert {"greedy", "beam4"} <= set(result["test"]["test_2016"]) and "bleu" in result["test"]["test_2017"]["greedy"]
    assert len((out / "hypotheses_peer_test_2017_beam4.txt").read_text().splitlines()) == 3
    for name in ("curves.png", "attention.png", "samples.md", "tokenizer.json"):
        assert (out / name).is_file(), name
