"""scripts/bench_training_step.py runs end to end (one round, no compile): every variant is timed on
the synthetic batch and on a real Multi30k batch, with the committed benchmark's tokenizer. The
README's speed table comes from full runs of the same command."""
import subprocess
import sys
from pathlib import Path

from transformer_lib.data import multi30k_dir

REPO = Path(__file__).resolve().parent.parent
EAGER_VARIANTS = ["peer fp32", "ours fp32", "ours bf16", "ours bf16, paper dropout",
                  "ours bf16, paper dropout, explicit attention"]


def test_bench_training_step_smoke_run():
    data_dir = multi30k_dir() or REPO.parent / "shared" / "data" / "multi30k"
    command = [sys.executable, str(REPO / "scripts" / "bench_training_step.py"), "--data-dir", str(data_dir),
               "--repeats", "1", "--warmup", "1", "--real-batches", "1", "--no-compile"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    tables = [line.split(" | ")[0].removeprefix("| ") for line in done.stdout.splitlines()
              if line.startswith("| ") and not line.startswith("| variant")]
    expected_tables = 2 if data_dir.is_dir() else 1          # the real batches need Multi30k
    assert tables == EAGER_VARIANTS * expected_tables
