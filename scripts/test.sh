#!/usr/bin/env bash
# The whole test suite: unit tests, the export-sync check, the website in a real browser, and strict
# nbval over every notebook and solution, run once, from the installed wheel in an empty folder on
# another CPU family's kernels (tests/test_off_repo.py).
# On every core (pytest-xdist): one worker per core, each test file on one worker (tests/conftest.py).
# Each worker's torch uses one thread, since two threads per worker on shared cores run many times
# slower. Extra arguments go to pytest (`-n 0` runs everything in this process); a notebook's path
# runs it in the checkout too, e.g. `bash scripts/test.sh notebooks/05_multihead_attention.ipynb`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --dev
export PYTHONHASHSEED=0 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest tests --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider -n auto --dist loadfile "$@"
