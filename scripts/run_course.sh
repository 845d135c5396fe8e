#!/usr/bin/env bash
# The course's main job, headless: execute every notebook in order (executed copies in
# build/notebooks/), then translate with the model notebook 11 trained. This is the one run that
# writes figures into images/, and only those whose picture really changed (transformer_lib/course.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
mkdir -p build/notebooks
export COURSE_FIGURES_DIR="$PWD/images"
for notebook in notebooks/[0-9][0-9]_*.ipynb; do
    started=$SECONDS
    .venv/bin/jupyter nbconvert --to notebook --execute --output-dir build/notebooks "$notebook" \
        --ExecutePreprocessor.timeout=1800 --log-level ERROR
    echo "== $notebook ran in $((SECONDS - started)) s"
done
echo "== the course model (trained on the built-in corpus by notebook 11) translates:"
.venv/bin/python -m transformer_lib translate --run runs/course_model --beam 4 \
    "the brave fox will chase a small bird near the river" \
    "some tired horses waited behind the old houses" \
    "a clever queen painted the red boats"
