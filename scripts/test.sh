#!/usr/bin/env bash
# The whole test suite: unit tests, the export-sync check, and strict nbval over every notebook.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export PYTHONHASHSEED=0
exec .venv/bin/python -m pytest tests notebooks --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider "$@"
