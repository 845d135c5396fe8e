"""Data-parallel training (transformer_lib/distributed.py and `train` under torchrun), on the CPU
with gloo: 2 processes of 1 thread each reach the weights of 1 process with `--accumulate 2`; a
rank killed with SIGKILL and a relaunch of the same command give the history of an uninterrupted
run; the sharding of an epoch's batches is disjoint and equal, and bad input is refused clearly."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from transformer_lib.distributed import DistributedTrainer, setup_distributed, shard_batches
from transformer_lib.training import load_checkpoint

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])),
       "OMP_NUM_THREADS": "1"}
TINY = ["--data", "builtin", "--vocab-size", "200", "--d-model", "32", "--heads", "2", "--d-ff", "64",
        "--layers", "1", "--max-tokens", "512", "--threads", "1", "--device", "cpu", "--no-progress", "--seed", "0"]
# --standalone: torchrun picks a free port, so runs side by side (and other users of port 29500) do not meet.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "transformer_lib"]


def train(run: Path, *extra, processes: int = 2, **popen) -> list[str]:
    """The command line of `train` in `processes` processes (torchrun) or in one (plain)."""
    launcher = TORCHRUN if processes == 2 else [sys.executable, "-m", "transformer_lib"]
    # "--": torchrun would take `--run` for an abbreviation of its own `--run-path`.
    return [*launcher, *(["--"] if processes == 2 else []), "train", "--run", str(run), *TINY, *extra]


def finished(command: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def history(run: Path) -> list[dict]:
    """The logged steps of a finished run, without their wall-clock times."""
    return [{k: v for k, v in h.items() if k != "elapsed"} for h in json.loads((run / "history.json").read_text())["history"]]


# --- (a) 2 processes = 1 process accumulating 2 batches per update ---------------------------------

@pytest.fixture(scope="module")
def pair_of_runs(tmp_path_factory) -> tuple[Path, Path, dict, dict]:
    """The same 20 updates (dropout 0), by 2 processes and by 1 process with --accumulate 2; and their summaries."""
    folder = tmp_path_factory.mktemp("ddp")
    settings = ["--dropout", "0", "--max-steps", "20", "--checkpoint-every", "10"]
    two = subprocess.Popen(train(folder / "two", *settings), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    one = finished(train(folder / "one", *settings, "--accumulate", "2", processes=1))
    out, err = two.communicate(timeout=300)
    assert two.returncode == 0, err[-3000:]
    return folder / "two", folder / "one", json.loads(out), json.loads(one.stdout)


def test_two_processes_reach_the_weights_of_one_accumulating_two(pair_of_runs):
    two, one, two_summary, one_summary = pair_of_runs
    assert (two_summary["processes"], two_summary["accumulate"]) == (2, 1)
    assert (one_summary["processes"], one_summary["accumulate"]) == (1, 2)
    ddp, accumulated = load_checkpoint(two / "checkpoint.pt"), load_checkpoint(one / "checkpoint.pt")
    assert ddp["state"]["step"] == accumulated["state"]["step"] == 20
    assert not any(name.startswith("module.") for name in ddp["model"]), "save the unwrapped model, not DDP's"
    torch.testing.assert_close(ddp["model"], accumulated["model"])
    # The logged loss is the mean over both ranks: the mean one process logs over its two batches.
    for a, b in zip(history(two), history(one), strict=True):
        assert a["step"] == b["step"] and a["tokens"] == b["tokens"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6) and a["accuracy"] == b["accuracy"]
    meta = json.loads((two / "config.json").read_text())
    assert (meta["processes"], meta["accumulate"]) == (2, 1)
    assert len(ddp["ranks"]) == 2 and ddp["world_size"] == 2


# --- (b) a killed rank, a relaunch, the uninterrupted history --------------------------------------

def worker_pids(launcher: subprocess.Popen) -> list[int]:
    """The processes torchrun started (Linux: /proc lists every process's children)."""
    path = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
    return [int(pid) for pid in path.read_text().split()] if path.is_file() else []


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's workers through Linux's /proc")
def test_killed_rank_and_relaunch_resume_exactly(tmp_path):
    settings = ["--dropout", "0.1", "--max-steps", "100", "--checkpoint-every", "10"]   # dropout: RNG per rank
    killed_run, clean_run = tmp_path / "killed", tmp_path / "clean"
    clean = subprocess.Popen(train(clean_run, *settings), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    victim = subprocess.Popen(train(killed_run, *settings), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    checkpoint, killed_at, deadline = killed_run / "checkpoint.pt", None, time.monotonic() + 200
    try:
        while time.monotonic() < deadline and killed_at is None:
            if checkpoint.is_file() and load_checkpoint(checkpoint)["state"]["step"] >= 10:
                workers = worker_pids(victim)
                if workers:
                    killed_at = load_checkpoint(checkpoint)["state"]["step"]
                    os.kill(workers[-1], signal.SIGKILL)         # one rank dies; torchrun stops the other
            assert victim.poll() is None or killed_at is not None, "training ended before a rank could be killed"
            time.sleep(0.005)
        assert victim.wait(timeout=60) != 0, "torchrun reports the killed rank"
    finally:
        victim.kill()
        victim.wait()
    assert killed_at is not None and killed_at < 100, "no checkpoint appeared in time"
    assert not (killed_run / "history.json").exists()

    resumed = finished(train(killed_run, *settings))
    assert "resuming" in resumed.stderr and resumed.stderr.count("resuming") == 1, "rank 0 alone reports"
    _, clean_err = clean.communicate(timeout=300)
    assert clean.returncode == 0, clean_err[-3000:]
    assert [h["step"] for h in history(clean_run)] == list(range(10, 101, 10))
    assert history(killed_run) == history(clean_run)      # equal, not just close
    assert not list(killed_run.glob("*.tmp"))


def test_time_budget_stops_every_rank_at_the_same_step(tmp_path):
    """Each rank's clock differs; if one rank stopped a step before the other, DDP would wait until the process group's timeout."""
    result = finished(train(tmp_path / "run", "--max-steps", "100000", "--time-budget", "1s", "--checkpoint-every", "50"))
    summary = json.loads(result.stdout)
    assert 0 < summary["steps"] < 100000 and summary["train_seconds"] >= 1.0
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["state"]["step"] == summary["steps"]


# --- errors under torchrun: rank 0 says it once, nobody hangs ---------------------------------------

def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if "error: " in line and "Error" not in line.split("error: ")[0]]


def test_torchrun_refusal_is_one_line_from_rank_zero_and_leaves_the_run(pair_of_runs, tmp_path):
    """The 1-process run with --accumulate 2, resumed by 2 processes: refused, the run left as it was."""
    run = Path(shutil.copytree(pair_of_runs[1], tmp_path / "run"))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    result = subprocess.run(train(run, "--dropout", "0", "--max-steps", "30", "--accumulate", "2"), cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr[-3000:]
    assert "1 process(es) × --accumulate 2, this launch has 2 × --accumulate 2" in lines[0], lines[0]
    assert "--nproc_per_node=1" in lines[0], lines[0]
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


# --- (c) sharding and the pieces, in this process ------------------------------------------------

@pytest.mark.parametrize("n_batches, world_size", [(7, 2), (8, 2), (10, 3), (5, 5), (9, 1)])
def test_shards_are_disjoint_equal_and_cover_the_first_whole_rounds(n_batches, world_size):
    batches = [f"batch {i}" for i in range(n_batches)]
    shards = [shard_batches(batches, rank, world_size) for rank in range(world_size)]
    per_rank = n_batches // world_size
    assert all(len(shard) == per_rank for shard in shards)
    used = [b for shard in shards for b in shard]
    assert len(set(used)) == len(used), "a batch went to two ranks"
    assert sorted(used, key=batches.index) == batches[:world_size * per_rank]
    for k in range(per_rank):   # update k of the ranks = batches k·N ... k·N + N - 1, as accumulate=N uses
        assert [shard[k] for shard in shards] == batches[k * world_size:(k + 1) * world_size]


@pytest.mark.parametrize("rank, world_size, error, words", [
    (2, 2, ValueError, "0 <= rank < world_size"),
    (-1, 2, ValueError, "0 <= rank < world_size"),
    (0, 0, ValueError, "0 <= rank < world_size"),
    (0.0, 2, TypeError, "rank must be an int"),
    (0, True, TypeError, "world_size must be an int"),
    (0, 4, ValueError, "3 batches cannot give each of 4 processes one"),
])
def test_shard_bad_input(rank, world_size, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(")):
        shard_batches(["a", "b", "c"], rank, world_size)


def test_without_torchrun_a_world_of_one(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    context = setup_distributed("cpu")
    assert (context.rank, context.world_size, context.is_main, context.device) == (0, 1, True, torch.device("cpu"))
    with pytest.raises(ValueError, match="no process group: launch with torchrun"):
        DistributedTrainer(torch.nn.Linear(2, 2), None, None, lambda epoch: [], max_steps=1)


class _Batch:
    def __init__(self, x):
        self.x = x

    def to(self, device):
        return self


def test_checkpoint_is_plain_and_refuses_another_world_size(tmp_path):
    """In a process group of one: the checkpoint holds the model without DDP's `module.` prefix and
    this rank's state; a checkpoint written by 2 processes is refused with the number to use."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        data = [_Batch(torch.randn(4, 3)) for _ in range(4)]
        trainer = DistributedTrainer(model, lambda m, b: (m(b.x).square().mean(), {}),
                                     torch.optim.SGD(model.parameters(), lr=0.1), lambda epoch: data,
                                     max_steps=3, progress=False)
        trainer.fit()
        saved = trainer.checkpoint()
        assert set(saved["model"]) == {"weight", "bias"} and saved["world_size"] == 1 and len(saved["ranks"]) == 1
        trainer.restore(saved)
        assert trainer.state.step == 3
        with pytest.raises(ValueError, match=r"written by 2 processes, this run has 1.*--nproc_per_node=2"):
            trainer.restore({**saved, "world_size": 2, "ranks": saved["ranks"] * 2})
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("env, launcher", [
    ({}, ["python", "-m", "transformer_lib"]),
    ({"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"},
     ["torchrun", "--nproc_per_node=2", "-m", "transformer_lib", "--"]),
    ({"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"},
     ["torchrun", "--nproc_per_node=4", "--nnodes=2", "-m", "transformer_lib", "--"]),
], ids=["python", "torchrun", "two-nodes"])
def test_interrupted_run_names_the_launcher_that_resumes_it(monkeypatch, env, launcher):
    """The resume line after Ctrl-C: a run under torchrun refuses to resume in one process."""
    from transformer_lib import cli
    for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli._launcher() == launcher
