#!/usr/bin/env bash
# Start the course: set up .venv with the learner's set (scripts/setup_env.sh: PyTorch, Jupyter Lab,
# the course package in editable mode; none of the maintainer's tools), then open Jupyter Lab on the
# repository, at notebook 00.
# Needs only python3. Extra arguments go to `jupyter lab` (e.g. --no-browser, --port 8890).
# TORCH_SPEC picks the torch build, as for scripts/setup_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# Jupyter refuses to run as root unless told to (a container, a cloud machine).
if [ "$(id -u)" = 0 ]; then set -- --allow-root "$@"; fi
echo "Opening Jupyter Lab at notebooks/00_course_map.ipynb (stop it with Ctrl+C)"
# Kernels talk to Jupyter over local sockets, so none warns about unencrypted TCP (scripts/kernel_sockets.sh).
source scripts/kernel_sockets.sh
set -- "${kernel_sockets[@]}" "$@"
exec .venv/bin/jupyter lab --ServerApp.root_dir="$PWD" notebooks/00_course_map.ipynb "$@"
