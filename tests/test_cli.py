"""Tests for the command line (transformer_lib/cli.py) that concern training: a real training
process killed with SIGKILL and started again finishes with exactly the history of a run that was
never interrupted."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transformer_lib.training import load_checkpoint

ROOT = Path(__file__).resolve().parent.parent
# CPU even where CUDA is present: only there is every run bit-for-bit repeatable.
TINY = ["--data", "builtin", "--vocab-size", "200", "--d-model", "32", "--heads", "2", "--d-ff", "64",
        "--layers", "1", "--max-steps", "100", "--checkpoint-every", "10", "--max-tokens", "512",
        "--threads", "1", "--device", "cpu", "--no-progress", "--seed", "0"]


def train_command(run: Path) -> list[str]:
    return [sys.executable, "-m", "transformer_lib", "train", "--run", str(run), *TINY]


def logged(run: Path) -> list[tuple]:
    """(step, loss, accuracy, lr) of every logged step of a finished run."""
    history = json.loads((run / "history.json").read_text())["history"]
    return [(h["step"], h["loss"], h["accuracy"], h["lr"]) for h in history]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_killed_training_resumes_exactly(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed_run, clean_run = tmp_path / "killed", tmp_path / "clean"
    # The uninterrupted reference runs meanwhile, in its own process.
    clean = subprocess.Popen(train_command(clean_run), cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim = subprocess.Popen(train_command(killed_run), cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint, killed_at, deadline = killed_run / "checkpoint.pt", None, time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if checkpoint.is_file():
                step = load_checkpoint(checkpoint)["state"]["step"]   # atomic writes: always loadable
                if step >= 10:
                    victim.send_signal(signal.SIGKILL)
                    killed_at = step
                    break
            assert victim.poll() is None, "training finished before it could be killed; raise --max-steps"
            time.sleep(0.005)
    finally:
        victim.kill()
        victim.wait()
    assert killed_at is not None, "no checkpoint appeared in time"
    assert victim.returncode == -signal.SIGKILL
    assert killed_at < 100 and not (killed_run / "history.json").exists()

    resumed = subprocess.run(train_command(killed_run), cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr and "at step" in resumed.stderr
    _, clean_err = clean.communicate(timeout=300)
    assert clean.returncode == 0, clean_err

    assert [step for step, *_ in logged(clean_run)] == list(range(10, 101, 10))
    assert logged(killed_run) == logged(clean_run)          # equal per logged step, not just close
    assert not list(killed_run.glob("*.tmp"))


def test_train_logs_validation_loss_and_cools_down_to_zero(tmp_path, capsys):
    from transformer_lib.cli import main
    run = tmp_path / "run"
    settings = [arg for arg in TINY if arg != "--no-progress"]
    settings[settings.index("--max-steps") + 1] = "40"
    assert main(["train", "--run", str(run), *settings, "--no-progress", "--validate-every", "20",
                 "--cooldown", "0.5", "--attention-dropout", "0", "--activation-dropout", "0"]) == 0
    capsys.readouterr()
    history = json.loads((run / "history.json").read_text())["history"]
    assert [h["step"] for h in history if "valid_loss" in h] == [20, 40]
    assert all(0 < h["valid_loss"] < 10 for h in history if "valid_loss" in h)
    rates = [h["lr"] for h in history]                  # the rate set for the step after each log
    assert rates[-1] == 0.0 and rates[-2] > 0 and rates[1] > rates[2] > rates[3]   # warm-up, then the cooldown
    config = json.loads((run / "config.json").read_text())["model"]
    assert (config["attention_dropout"], config["activation_dropout"]) == (0.0, 0.0)
