#!/usr/bin/env bash
# Creates .venv (if missing) and installs the course and its tools into it. Needs only python3.
# TORCH_SPEC picks the torch build: the default pins the CPU wheel this project's CI keeps on disk;
# on another machine set e.g. TORCH_SPEC=torch to take whatever build pip chooses there, or
# TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu" (split into words on purpose).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# shellcheck disable=SC2086
.venv/bin/python -m pip install -q --disable-pip-version-check ${TORCH_SPEC:-torch==2.13.0}
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt -e .
