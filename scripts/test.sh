#!/usr/bin/env bash
# The whole test suite: unit tests, the export-sync check, the off-repo run of every notebook, the
# website in a real browser, and strict nbval over every notebook and solution.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export PYTHONHASHSEED=0
exec .venv/bin/python -m pytest tests notebooks solutions --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider "$@"
