#!/usr/bin/env bash
# The course's main job, headless: execute every notebook in order (executed copies in
# build/notebooks/), then translate with the model notebook 11 trained. It leaves the checkout as it
# was: what it writes goes to build/ and runs/, which git ignores.
#   bash scripts/run_course.sh                    the learner's run
#   bash scripts/run_course.sh 00 04              only these notebooks, by number (the translation
#                                                 at the end needs notebook 11's model: it runs
#                                                 when 11 is among them)
#   bash scripts/run_course.sh --update-figures   a maintainer's: also rewrite the figures in images/
#                                                 whose picture changed (transformer_lib/course.py)
set -euo pipefail
cd "$(dirname "$0")/.."
notebooks=()
for arg in "$@"; do
    case "$arg" in
        --update-figures) export COURSE_FIGURES_DIR="$PWD/images" ;;
        [0-9][0-9])
            matches=(notebooks/"$arg"_*.ipynb)
            if [ ! -f "${matches[0]}" ]; then
                echo "run_course.sh: error: no notebook numbered $arg in notebooks/ (they run from 00 to $(ls notebooks | grep -o '^[0-9][0-9]' | tail -n 1))" >&2
                exit 2
            fi
            notebooks+=("${matches[0]}") ;;
        *) echo "run_course.sh: error: unknown argument '$arg' (give notebook numbers such as 00 04, or --update-figures)" >&2
           exit 2 ;;
    esac
done
[ "${#notebooks[@]}" -gt 0 ] || notebooks=(notebooks/[0-9][0-9]_*.ipynb)
bash scripts/setup_env.sh
mkdir -p build/notebooks
source scripts/kernel_sockets.sh
[ -z "${socket_dir_is_temporary:-}" ] || trap 'rm -rf "$socket_dir"' EXIT
course_started=$SECONDS
for notebook in "${notebooks[@]}"; do
    started=$SECONDS
    .venv/bin/jupyter nbconvert --to notebook --execute --output-dir build/notebooks "$notebook" \
        --ExecutePreprocessor.timeout=1800 "${kernel_sockets[@]}" --log-level ERROR
    echo "== $notebook ran in $((SECONDS - started)) s"
done
echo "== ${#notebooks[@]} notebook(s) ran in $((SECONDS - course_started)) s"
case " ${notebooks[*]} " in
    *" notebooks/11_"*) ;;
    *) exit 0 ;;
esac
echo "== the course model (trained on the built-in corpus by notebook 11) translates:"
.venv/bin/python -m transformer_lib translate --run runs/course_model --beam 4 \
    "the brave fox will chase a small bird near the river" \
    "some tired horses waited behind the old houses" \
    "a clever queen painted the red boats"
