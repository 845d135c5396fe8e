#!/usr/bin/env bash
# Strict nbval over every notebook and solution as another CPU family would run them: other kernels
# (AVX2 instead of AVX-512/AMX, in oneDNN and in ATen) and one thread, against the same stored
# outputs. Notebook 11 retrains the course model under this setting, so notebooks 12-13 see a
# model that really differs from the one their outputs were stored with. Assumes .venv exists.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONHASHSEED=0 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest notebooks solutions --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider -q "$@"
