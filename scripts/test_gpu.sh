#!/usr/bin/env bash
# The one GPU check: strict nbval over every notebook and solution on a CUDA device (the notebooks
# pick it through transformer_lib.device.pick_device), then the unit tests' CUDA variants; writes
# results/gpu/summary.json and summary.md (GPU, capability, torch and CUDA versions, counts, time).
# The stored outputs are the CPU ones, so a pass proves they reproduce on this GPU.
#
#   bash scripts/test_gpu.sh [PYTEST_ARGS ...]      # e.g. -x, or -k 04_attention to narrow both runs
#
# Setup, the first that applies:
#   PYTHON=/path/to/python   use that interpreter as it is (it has torch, jupyter, nbval, ...);
#   WHEELS_DIR=.whl          the system's python3 (with a CUDA torch) plus the wheels in that folder,
#                            installed offline into build/gpu-site (see ../shared/tools/gpu_wheels.sh);
#   neither                  scripts/setup_env.sh with TORCH_SPEC (default here: `torch`, the build
#                            pip picks, CUDA on Linux x86-64), then .venv/bin/python.
# Exit codes: 0 all passed; 1 a test failed; 2 no CUDA device (one line says why) or a bad setup.
# GPU_RESULTS_DIR (default results/gpu) is where the summary goes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
fail() { echo "test_gpu.sh: error: $*" >&2; exit 2; }

if [ -n "${PYTHON:-}" ]; then
    command -v "$PYTHON" >/dev/null || fail "PYTHON=$PYTHON is not an interpreter"
    SETUP="PYTHON=$PYTHON as it is"
elif [ -n "${WHEELS_DIR:-}" ]; then
    compgen -G "$WHEELS_DIR/*.whl" >/dev/null || fail "WHEELS_DIR=$WHEELS_DIR holds no .whl files"
    PYTHON=python3
    rm -rf build/gpu-site
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check \
        --no-index --no-deps --no-compile --no-cache-dir --target build/gpu-site "$WHEELS_DIR"/*.whl || fail "installing the wheels of $WHEELS_DIR failed"
    export PYTHONPATH="$ROOT/build/gpu-site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    SETUP="python3 with the wheels of $WHEELS_DIR"
else
    TORCH_SPEC=${TORCH_SPEC:-torch} bash scripts/setup_env.sh --dev
    PYTHON=.venv/bin/python
    SETUP="scripts/setup_env.sh --dev, TORCH_SPEC=${TORCH_SPEC:-torch}"
fi

# One line and exit 2 when there is nothing to test on; says whether torch or the machine lacks CUDA.
"$PYTHON" - <<'EOF' || exit 2
import sys
try:
    import torch
except ImportError as error:
    sys.exit(f"test_gpu.sh: error: no torch in this Python ({error}); see the setup in scripts/test_gpu.sh")
if torch.version.cuda is None:
    sys.exit(f"test_gpu.sh: error: torch {torch.__version__} is built without CUDA; install a CUDA build "
             "(TORCH_SPEC=torch on Linux x86-64) and run again")
if not torch.cuda.is_available():
    sys.exit(f"test_gpu.sh: error: no CUDA device visible (torch {torch.__version__}, CUDA {torch.version.cuda}); "
             "run this on a machine with an NVIDIA GPU")
EOF

export PYTHONHASHSEED=0
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# Keeps the unit tests that run on CUDA: a "cuda" in their id (test_cuda_..., [cuda] variants) or a
# skip-unless-CUDA mark ("needs CUDA"). Files are those that mention CUDA or share the device
# parameter of tests/reference_weights.py.
cat >"$WORK/gpu_select.py" <<'EOF'
def pytest_collection_modifyitems(config, items):
    def on_cuda(item):
        reasons = " ".join(str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))
        return "cuda" in item.nodeid.lower() or "cuda" in reasons.lower()
    keep = [item for item in items if on_cuda(item)]
    config.hook.pytest_deselected(items=[item for item in items if not on_cuda(item)])
    items[:] = keep
EOF
mapfile -t UNIT_FILES < <(grep -l -i -E "cuda|reference_weights" tests/test_*.py)

# On every core where pytest-xdist is installed, as scripts/test.sh does: each file (so each notebook's
# kernel) on one worker, notebooks 11-13 together and in order (tests/conftest.py), one torch thread
# a worker. Without xdist (the lent GPU machine's wheels), in this process. `-n 0` turns it off.
NBVAL_XDIST=() UNIT_XDIST=()
if "$PYTHON" -c "import xdist" 2>/dev/null; then
    UNIT_XDIST=(-n auto --dist loadfile)
    NBVAL_XDIST=("${UNIT_XDIST[@]}" -p tests.conftest)
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi

run_part() {   # name, then pytest arguments; records exit code and seconds
    local name=$1 start rc=0
    shift
    start=$(date +%s.%N)
    "$PYTHON" -m pytest "$@" -p no:cacheprovider -q --junitxml="$WORK/$name.xml" || rc=$?
    echo "$rc $(date +%s.%N) $start" >"$WORK/$name.status"
}
START_ALL=$(date +%s.%N)
run_part nbval notebooks solutions --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
    "${NBVAL_XDIST[@]}" "$@"
PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}" run_part unit "${UNIT_FILES[@]}" -p gpu_select "${UNIT_XDIST[@]}" "$@"

SETUP="$SETUP" START_ALL="$START_ALL" WORK="$WORK" OUT="${GPU_RESULTS_DIR:-results/gpu}" "$PYTHON" - "$@" <<'EOF'
"""Summary of the two runs: results/gpu/summary.json and summary.md, each written atomically."""
import json, os, platform, subprocess, sys, time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

import torch

work, out = Path(os.environ["WORK"]), Path(os.environ["OUT"])
parts = {}
for name in ("nbval", "unit"):
    rc, end, start = (work / f"{name}.status").read_text().split()
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed = []
    if (work / f"{name}.xml").is_file():
        for case in ET.parse(work / f"{name}.xml").getroot().iter("testcase"):
            kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
            counts[{"failure": "failed", "error": "errors", "skipped": "skipped", None: "passed"}[kind]] += 1
            if kind in ("failure", "error"):
                failed.append(f"{case.get('classname')}::{case.get('name')}")
    parts[name] = {**counts, "exit_code": int(rc), "seconds": round(float(end) - float(start), 1),
                   "failed_tests": failed[:50]}
# pytest's 5 is "no tests collected" (a -k that matched nothing there); anything else non-zero failed.
ok = all(p["exit_code"] in (0, 5) and not p["failed"] and not p["errors"] for p in parts.values()) \
    and sum(p["passed"] for p in parts.values()) > 0

def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None

props = torch.cuda.get_device_properties(0)
summary = {
    "status": "passed" if ok else "failed",
    "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "gpu": torch.cuda.get_device_name(0), "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
    "gpu_memory_gib": round(props.total_memory / 2 ** 30, 1), "gpu_count": torch.cuda.device_count(),
    "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
    "commit": git("rev-parse", "HEAD"),
    "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
    "command": " ".join(["bash scripts/test_gpu.sh", *sys.argv[1:]]), "setup": os.environ["SETUP"],
    "wall_seconds": round(time.time() - float(os.environ["START_ALL"]), 1),
    "parts": {"nbval": {"what": "strict nbval over notebooks/ and solutions/", **parts["nbval"]},
              "unit": {"what": "the unit tests' CUDA variants", **parts["unit"]}},
}
rows = "\n".join(f"| {p['what']} | {p['passed']} | {p['failed'] + p['errors']} | {p['skipped']} | {p['seconds']:.0f} |"
                 for p in summary["parts"].values())
markdown = f"""# GPU check: {summary['status']}

`bash scripts/test_gpu.sh` on {summary['gpu']} (capability {summary['capability']}, {summary['gpu_memory_gib']} GiB),
torch {summary['torch']}, CUDA {summary['cuda']}, Python {summary['python']}, {summary['date_utc']},
commit {(summary['commit'] or 'unknown')[:12]}{' with uncommitted changes' if summary['uncommitted_changes'] else ''}.

| run | passed | failed | skipped | seconds |
|---|---|---|---|---|
{rows}

Wall time {summary['wall_seconds']:.0f} s. Setup: {summary['setup']}.
"""
out.mkdir(parents=True, exist_ok=True)
for name, text in (("summary.json", json.dumps(summary, indent=1) + "\n"), ("summary.md", markdown)):
    tmp = out / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, out / name)          # atomic: a reader sees the old file or the new, never half
print(markdown)
sys.exit(0 if ok else 1)
EOF
