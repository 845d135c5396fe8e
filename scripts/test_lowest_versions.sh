#!/usr/bin/env bash
# Do the lower bounds in requirements.txt hold? Builds build/lowest-venv with the lowest version
# each bound allows (`>=X` becomes `==X`) on this Python and runs the unit tests there.
#   bash scripts/test_lowest_versions.sh            # extra arguments go to pytest
# Slow the first time: the oldest torch on PyPI is a CUDA build of several GB. Not part of .ci/run.
# Left out: jupyter (the notebooks run under the newest tools in scripts/test.sh) and the tests that
# need the notebook and site tooling (the export-sync check needs nbdev, the site test Sphinx and
# Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=build/lowest-venv
mkdir -p build
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"

# The pins, read from requirements.txt so that raising a bound there is all it takes.
sed -n 's/^\([A-Za-z0-9_.-]*\)>=\([^ ;#]*\).*/\1==\2/p' requirements.txt | grep -v '^jupyter==' > build/lowest-pins.txt
# What those old releases need from their own dependencies, which pip would otherwise take newest:
# matplotlib 3.7 is compiled against NumPy 1.x and fails to import under NumPy 2
# ("numpy.core.multiarray failed to import"; torch 2.3 prints a warning there too).
# pyarrow (for datasets) from the same era as datasets 2.18: today's pyarrow needs NumPy 2.
cat > build/lowest-constraints.txt <<'EOF'
numpy<2
pyarrow<16
EOF
echo "lowest versions:" $(cat build/lowest-pins.txt)

pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install -q --upgrade pip
pip install -q --only-binary=:all: -r build/lowest-pins.txt -c build/lowest-constraints.txt "pytest==8.0.0"
pip install -q --no-deps -e .
pip check || true
"$VENV/bin/python" - <<'EOF'
# Import each one: a test that skips when a package cannot be imported would otherwise hide it.
import datasets, matplotlib.pyplot, sacrebleu, tokenizers, torch, tqdm  # noqa: F401
import importlib.metadata as md
print("installed:", ", ".join(f"{n} {md.version(n)}" for n in
      ("torch", "numpy", "tokenizers", "datasets", "pyarrow", "sacrebleu", "tqdm", "matplotlib", "huggingface-hub")))
EOF

# One thread: the tests are small, and this script usually runs beside other work.
export OMP_NUM_THREADS=1 PYTHONHASHSEED=0
exec "$VENV/bin/python" -m pytest tests -p no:cacheprovider -q \
    --ignore tests/test_export_sync.py --ignore tests/test_site.py -k "not site and not off_repo" "$@"
