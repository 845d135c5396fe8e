#!/usr/bin/env bash
# The course's main job, headless: execute every notebook in order (figures land in images/,
# executed copies in build/notebooks/), then translate with the model notebook 11 trained.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
mkdir -p build/notebooks
for notebook in notebooks/[0-9][0-9]_*.ipynb; do
    echo "== $notebook"
    .venv/bin/jupyter nbconvert --to notebook --execute --output-dir build/notebooks "$notebook" \
        --ExecutePreprocessor.timeout=1800 --log-level ERROR
done
echo "== the course model (trained on the built-in corpus by notebook 11) translates:"
.venv/bin/python -m transformer_lib translate --run runs/course_model --beam 4 \
    "the brave fox will chase a small bird near the river" \
    "some tired horses waited behind the old houses" \
    "a clever queen painted the red boats"
