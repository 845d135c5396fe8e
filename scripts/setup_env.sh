#!/usr/bin/env bash
# Creates .venv (if missing) and installs the course and its tools into it. Needs only python3.
# TORCH_SPEC picks the torch build: the default pins the CPU wheel this project's CI keeps on disk;
# on another machine set e.g. TORCH_SPEC=torch to take whatever build pip chooses there, or
# TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu" (split into words on purpose).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# pip runs only when what it installs from changed since the last time it ran (a stamp in .venv/);
# delete .venv/setup_env.stamp to make it run again.
stamp=$(cat requirements.txt requirements-dev.txt pyproject.toml <(echo "${TORCH_SPEC:-}") | sha256sum)
if [ "$(cat .venv/setup_env.stamp 2>/dev/null)" != "$stamp" ]; then
    # shellcheck disable=SC2086
    .venv/bin/python -m pip install -q --disable-pip-version-check ${TORCH_SPEC:-torch==2.13.0}
    .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt -e .
    echo "$stamp" > .venv/setup_env.stamp
fi
# The course website (scripts/build_site.sh) and its browser test (tests/test_site.py) need
# MathJax from npm (docs/package-lock.json) and a Chromium: Debian's `chromium` is installed here
# when running as root; elsewhere set CHROMIUM_PATH to a Chromium or Chrome binary.
if [ ! -f docs/node_modules/.package-lock.json ] || [ docs/package-lock.json -nt docs/node_modules/.package-lock.json ]; then
    if command -v npm >/dev/null; then
        (cd docs && npm ci --silent --no-audit --no-fund)
    else
        echo "setup_env.sh: npm not found; the course website (scripts/build_site.sh) needs Node.js's npm" >&2
    fi
fi
if [ -z "${CHROMIUM_PATH:-}" ] && [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
        >/tmp/setup_env_chromium.log 2>&1 || { cat /tmp/setup_env_chromium.log >&2; exit 1; }
fi
