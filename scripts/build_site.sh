#!/usr/bin/env bash
# Builds the course website into build/site/ from README.md and the notebooks' stored outputs
# (no notebook is executed). Adds the maintainer's tools it needs to .venv first (Sphinx, myst-nb,
# MathJax in docs/node_modules: scripts/setup_env.sh --dev, which does nothing when they are there).
# View it with: .venv/bin/python -m http.server -d build/site   (then open http://127.0.0.1:8000)
# Extra arguments go to sphinx-build (e.g. -W to turn warnings into errors).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --dev
.venv/bin/python docs/stage_site.py build/site_src
# From scratch every time, so no page of a renamed or deleted notebook lingers.
rm -rf build/site build/site_doctrees
.venv/bin/python -m sphinx -b html -q -c docs -d build/site_doctrees build/site_src build/site "$@"
echo "site built: build/site/index.html"
