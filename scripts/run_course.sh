#!/usr/bin/env bash
# The course's main job, headless: execute every notebook in order (executed copies in
# build/notebooks/), then translate with the model notebook 11 trained. It leaves the checkout as it
# was: what it writes goes to build/ and runs/, which git ignores.
#   bash scripts/run_course.sh                    the learner's run
#   bash scripts/run_course.sh --update-figures   a maintainer's: also rewrite the figures in images/
#                                                 whose picture changed (transformer_lib/course.py)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") ;;
    --update-figures) export COURSE_FIGURES_DIR="$PWD/images" ;;
    *) echo "run_course.sh: error: unknown option '$1' (the only one is --update-figures)" >&2
       exit 2 ;;
esac
bash scripts/setup_env.sh
mkdir -p build/notebooks
# The kernels talk to nbconvert over local sockets (IPC), not TCP: over TCP every kernel warns that
# its traffic is unencrypted, a warning a learner can do nothing about. The sockets' path is absolute
# (Jupyter's runtime folder), since a kernel runs in its notebook's folder and a relative one would
# name another place there. Windows has no IPC transport.
case "$(uname -s)" in
    MINGW*|MSYS*|CYGWIN*) transport=(--KernelManager.transport=tcp) ;;
    *) transport=(--KernelManager.transport=ipc --KernelManager.ip="$(.venv/bin/jupyter --runtime-dir)/kernel-ipc") ;;
esac
for notebook in notebooks/[0-9][0-9]_*.ipynb; do
    started=$SECONDS
    .venv/bin/jupyter nbconvert --to notebook --execute --output-dir build/notebooks "$notebook" \
        --ExecutePreprocessor.timeout=1800 "${transport[@]}" --log-level ERROR
    echo "== $notebook ran in $((SECONDS - started)) s"
done
echo "== the course model (trained on the built-in corpus by notebook 11) translates:"
.venv/bin/python -m transformer_lib translate --run runs/course_model --beam 4 \
    "the brave fox will chase a small bird near the river" \
    "some tired horses waited behind the old houses" \
    "a clever queen painted the red boats"
