#!/usr/bin/env bash
# Start the course: set up .venv (as scripts/setup_env.sh does for every command of the course:
# PyTorch, Jupyter, the course package in editable mode), then open Jupyter Lab on the repository, at notebook 00.
# Needs only python3. Extra arguments go to `jupyter lab` (e.g. --no-browser, --port 8890).
# TORCH_SPEC picks the torch build, as for scripts/setup_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# Jupyter refuses to run as root unless told to (a container, a cloud machine).
if [ "$(id -u)" = 0 ]; then set -- --allow-root "$@"; fi
echo "Opening Jupyter Lab at notebooks/00_course_map.ipynb (stop it with Ctrl+C)"
exec .venv/bin/jupyter lab --ServerApp.root_dir="$PWD" notebooks/00_course_map.ipynb "$@"
