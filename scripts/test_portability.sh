#!/usr/bin/env bash
# Strict nbval over every notebook and solution as another CPU family would run them: other kernels
# (AVX2 instead of AVX-512/AMX, in oneDNN and in ATen) and one thread, against the same stored
# outputs. Notebooks 11-13 load the course model from runs/course_model, which the test command
# trained (notebook 11 trains it here only when it is missing). Assumes .venv exists.
# One single-threaded kernel per core (pytest-xdist), sharing the work as scripts/test.sh does:
# tests/conftest.py, loaded with -p since no file of tests/ is collected here.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONHASHSEED=0 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest notebooks solutions --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider -p tests.conftest \
    -n auto --dist loadfile -q "$@"
