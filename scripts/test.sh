#!/usr/bin/env bash
# The whole test suite: unit tests, the export-sync check, the off-repo run of every notebook, the
# website in a real browser, and strict nbval over every notebook and solution.
# On every core (pytest-xdist): one worker per core, each file (so each notebook's kernel) on one
# worker, notebooks 11-13 together and in order (tests/conftest.py). Each worker's torch uses one
# thread, since two threads per worker on shared cores run many times slower. Extra arguments go to
# pytest (`-n 0` runs everything in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --dev
export PYTHONHASHSEED=0 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest tests notebooks solutions --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider -n auto --dist loadfile "$@"
