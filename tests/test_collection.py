"""The test ids are the same every time they are collected.

pytest-xdist has each worker collect the tests and stops the run when two workers disagree, so a
test id built from the clock (gzip's header holds the time), a random draw, a temporary path or the
order of a set lands one day and fails the next. Here the tests are collected twice, more than a
second apart, with another hash seed and another temporary folder, and both lists must be equal.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def collect(tmp: Path, hash_seed: str, ignored: list[str]) -> list[str]:
    """The ids `pytest --collect-only` finds under tests/ (less the files this run ignores, as the
    unit-test matrix ignores the site's), collected in a fresh process."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "TMPDIR": str(tmp)}
    done = subprocess.run([sys.executable, "-m", "pytest", "tests", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-p", "no:xdist", *(f"--ignore={path}" for path in ignored)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_collection_is_the_same_twice(tmp_path, request):
    ignored = request.config.getoption("ignore") or []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    started = time.monotonic()
    first = collect(tmp_path / "a", "1", ignored)
    time.sleep(max(0.0, 1.1 - (time.monotonic() - started)))   # another second on the clock
    second = collect(tmp_path / "b", "2", ignored)
    assert len(first) > 100
    changed = sorted(set(first) ^ set(second))
    assert not changed, f"test ids that differ between two collections: {changed[:10]}"
    assert first == second, "the tests were collected in another order the second time"
