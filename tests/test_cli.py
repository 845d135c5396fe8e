"""Tests for the command line (transformer_lib/cli.py) that concern training: a real training
process killed with SIGKILL and started again finishes with exactly the history of a run that was
never interrupted (taking over the lock the killed one left); Ctrl-C or SIGTERM saves a checkpoint
at the current step and exits 130 or 143 with one line that says how to resume; a second `train`
on a folder that one is writing is refused with the holder's pid; and `--amp` resolves as
`device.pick_amp` says, recorded in the run."""
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
    assert (killed_run / "train.lock").read_text() == str(victim.pid), "the killed train's lock is left behind"

    resumed = subprocess.run(train_command(killed_run), cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr and "at step" in resumed.stderr
    _, clean_err = clean.communicate(timeout=300)
    assert clean.returncode == 0, clean_err

    assert [step for step, *_ in logged(clean_run)] == list(range(10, 101, 10))
    assert logged(killed_run) == logged(clean_run)          # equal per logged step, not just close
    assert not list(killed_run.glob("*.tmp")) and not (killed_run / "train.lock").exists(), "stale lock taken over"


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


def wait_for_checkpoint(process: subprocess.Popen, checkpoint: Path, at_least: int) -> int:
    """The step of the first checkpoint at or past `at_least` that `process` writes (it must still run)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if checkpoint.is_file():
            step = load_checkpoint(checkpoint)["state"]["step"]
            if step >= at_least:
                return step
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.01)
    raise AssertionError("no checkpoint appeared in time")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_training_saves_its_step_and_resumes_from_it(tmp_path, signum):
    """Ctrl-C used to print a KeyboardInterrupt traceback, exit 1 and lose the steps since the last
    checkpoint. While it trains, a second train on the same folder is refused with its pid."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = tmp_path / "run"
    command = [*train_command(run), "--max-steps", "100000", "--checkpoint-every", "5", "--amp", "none"]
    trainer = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_checkpoint(trainer, run / "checkpoint.pt", 5)
        if signum == signal.SIGINT:
            second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            assert second.returncode == 2, second.stderr
            assert second.stderr.strip().splitlines() == [
                f"error: another train (pid {trainer.pid}) is writing {run}, so it is left to that one; wait for it "
                "to end (or stop it), or train into another --run folder"]
        trainer.send_signal(signum)
        out, err = trainer.communicate(timeout=120)
    finally:
        trainer.kill()
        trainer.wait()
    assert trainer.returncode == 128 + signum, err
    assert out == ""
    saved = load_checkpoint(run / "checkpoint.pt")["state"]["step"]
    lines = err.strip().splitlines()         # what it read and will train, then the one line of the stop
    assert "precision: float32 (--amp none)" in lines[:-1] and lines[0] == "data: --data builtin", err
    assert lines[-1] == (f"interrupted at step {saved}: saved {run / 'checkpoint.pt'}; resume with the same command: "
                         f"python -m transformer_lib {' '.join(command[3:])}"), err
    assert saved >= 5 and not (run / "train.lock").exists() and not list(run.glob("*.tmp"))

    again = [*command, "--max-steps", str(saved + 2)]
    resumed = subprocess.run(again, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {run / 'checkpoint.pt'} at step {saved}" in resumed.stderr
    assert json.loads(resumed.stdout)["steps"] == saved + 2


# --- --amp -----------------------------------------------------------------------------------------------

def cuda_capability(monkeypatch, capability: tuple[int, int]) -> None:
    import torch
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


@pytest.mark.parametrize("choice, device, capability, native_bf16, expected", [
    ("auto", "cuda", (8, 0), False, "bf16"),      # A100, H100, RTX 30xx and later
    ("auto", "cuda", (7, 5), False, "fp16"),      # T4: bf16 only emulated there
    ("auto", "cpu", None, False, None),           # no bf16 instructions: float32, nothing measured
    ("auto", "cpu", None, True, None),            # with them but no batches (a short run): not measured
    ("auto", "mps", None, True, None),
    ("none", "cuda", (9, 0), True, None),
    ("bf16", "cpu", None, False, "bf16"),         # explicit choices are kept
    ("fp16", "cuda", (8, 0), True, "fp16"),
])
def test_resolve_amp(monkeypatch, choice, device, capability, native_bf16, expected):
    from transformer_lib import device as device_module, settings, train_run

    def never(*args, **kwargs):
        raise AssertionError("measured although it need not be")
    if capability:
        cuda_capability(monkeypatch, capability)
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: native_bf16)
    monkeypatch.setattr(device_module, "faster_cpu_autocast", never)
    assert train_run.resolve_amp(choice, device, model=object(), batches=None, loss_fn=never) == expected


def train_in_process(run: Path, capsys, *extra) -> tuple[dict, str]:
    """`main(["train", ...])` in this process (so that mocks apply): (history.json, stderr)."""
    from transformer_lib.cli import main
    settings = [arg for arg in TINY if arg not in ("--max-steps", "100")]
    assert main(["train", "--run", str(run), *settings, *extra]) == 0
    stderr = capsys.readouterr().err
    return json.loads((run / "history.json").read_text()), stderr


def test_amp_auto_on_a_cpu_is_measured_once_and_recorded(tmp_path, monkeypatch, capsys):
    """A CPU with bf16 instructions: auto measures (here: bf16 wins) on a long enough run, records
    the choice in config.json and history.json, and a resume keeps it without measuring again."""
    from transformer_lib import device as device_module
    measured = []

    def faster(model, batches, loss_fn, rounds=3):
        measured.append(len(batches))
        return "bf16", {"float32": 1.0, "bf16": 0.5}
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(device_module, "faster_cpu_autocast", faster)
    run = tmp_path / "run"
    history, stderr = train_in_process(run, capsys, "--time-budget", "1s")      # a time budget: long enough
    assert measured == [4] and history["amp"] == "bf16" and "precision: bf16 (--amp auto)" in stderr
    assert json.loads((run / "config.json").read_text())["amp"] == "bf16"
    history, stderr = train_in_process(run, capsys, "--time-budget", "2s")
    assert measured == [4], "a resume keeps the recorded precision"
    assert history["amp"] == "bf16" and "precision: bf16 (--amp auto)" in stderr
    history, stderr = train_in_process(run, capsys, "--time-budget", "3s", "--amp", "none")
    assert history["amp"] == "float32" and "precision: float32 (--amp none)" in stderr
    assert json.loads((run / "config.json").read_text())["amp"] == "bf16", "what the run began in"


@pytest.mark.parametrize("native_bf16", [False, True])
def test_amp_auto_on_a_cpu_without_measuring(tmp_path, monkeypatch, capsys, native_bf16):
    """float32 at once on a CPU without bf16 instructions (emulated bf16 is slower), and for a run too
    short to repay the measurement on one with them: the CPU default gets no slower."""
    from transformer_lib import device as device_module, settings, train_run

    def never(*args, **kwargs):
        raise AssertionError("measured although it need not be")
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: native_bf16)
    monkeypatch.setattr(device_module, "faster_cpu_autocast", never)
    steps = ["--time-budget", "1s"] if not native_bf16 else ["--max-steps", str(settings.AMP_MEASURE_MIN_STEPS - 1),
                                                              "--time-budget", "1s"]
    history, stderr = train_in_process(tmp_path / "run", capsys, *steps)
    assert history["amp"] == "float32" and "precision: float32 (--amp auto)" in stderr


@pytest.mark.parametrize("step, phase, words", [
    (7, "training", "interrupted at step 7: saved R/checkpoint.pt; resume with the same command: CMD"),
    (None, "preparing", "interrupted before the first step, so no training was lost; start it with the same "
                        "command: CMD"),
    (None, "training", "interrupted twice, so stopped at once without saving: the steps since the last checkpoint are "
                       "lost; resume from it with the same command: CMD"),
    (None, "finishing", "interrupted after the last step, which R/checkpoint.pt holds; R/history.json may not "
                        "be written"),
])
def test_interrupt_message_says_what_was_kept(step, phase, words):
    """The one line printed for a signal in each phase of `train` (the first case runs for real above)."""
    from transformer_lib.train_run import TrainingStopped as _Stopped
    assert _Stopped(signal.SIGINT, step, phase).message(Path("R"), "CMD") == words


def test_compile_pads_batches_to_a_multiple_of_8(tmp_path, monkeypatch, capsys):
    """`train --compile` pads every batch to a multiple of 8 (few shapes to compile for), records it,
    and a resume without --compile, whose batches would differ, is refused naming --compile. The
    compilation itself is mocked (minutes on a CPU; tests/test_compile.py compiles for real)."""
    import torch
    from transformer_lib.cli import main
    from transformer_lib.data import TranslationData
    compiled, shapes, batches = [], set(), TranslationData.batches

    def spy(self, *args, **kwargs):
        made = batches(self, *args, **kwargs)
        shapes.update((b.src.size(1) % 8, b.tgt_in.size(1) % 8) for b in made)
        return made
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: compiled.append(kwargs))
    monkeypatch.setattr(TranslationData, "batches", spy)
    run = tmp_path / "run"
    settings = [arg for arg in TINY if arg not in ("--max-steps", "100")]
    assert main(["train", "--run", str(run), *settings, "--max-steps", "2", "--compile"]) == 0
    assert compiled == [{"dynamic": True}] and shapes == {(0, 0)}
    assert json.loads((run / "config.json").read_text())["pad_to_multiple"] == 8
    capsys.readouterr()
    assert main(["train", "--run", str(run), *settings, "--max-steps", "3"]) == 2
    assert "pad_to_multiple 8 -> 1 (--pad-to-multiple, or --compile" in capsys.readouterr().err
    assert main(["train", "--run", str(run), *settings, "--max-steps", "3", "--pad-to-multiple", "8"]) == 0
    assert compiled == [{"dynamic": True}]          # the same batches, eager: resumed without compiling
