#!/usr/bin/env bash
# Creates .venv (if missing) and installs into it what the course needs. Needs only python3 (3.10 or
# newer; PYTHON=/path/to/python names another interpreter).
#   bash scripts/setup_env.sh         the learner's set: torch, Jupyter Lab, matplotlib, datasets,
#                                     tokenizers, sacreBLEU, tqdm, ipywidgets and the course package
#                                     (requirements.txt); what start_course.sh and run_course.sh use
#   bash scripts/setup_env.sh --dev   the maintainer's set on top: the test runners, nbdev, the
#                                     website's tools (requirements-dev.txt), MathJax from npm and,
#                                     as root on Debian, Chromium; what test.sh and build_site.sh use
# TORCH_SPEC picks the torch build: the default pins the CPU wheel this project's CI keeps on disk;
# on another machine set e.g. TORCH_SPEC=torch to take whatever build pip chooses there, or
# TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu" (split into words on purpose).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") dev=0 ;;
    --dev) dev=1 ;;
    *) echo "setup_env.sh: error: unknown option '$1' (use no option for the learner's set, --dev for the maintainer's)" >&2
       exit 2 ;;
esac
# The course needs Python 3.10 or newer (pyproject.toml's requires-python): say so in one line before
# pip would fail deep inside the install. PYTHON picks the interpreter that creates .venv.
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && python=.venv/bin/python
if ! version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
    echo "setup_env.sh: error: '$python' not found; install Python 3.10 or newer (https://www.python.org/downloads/), or name one with PYTHON=/path/to/python3.12" >&2
    exit 2
fi
case "$version" in
    2.*|3.[0-9]) echo "setup_env.sh: error: the course needs Python 3.10 or newer, and $python is Python $version; install a newer one and run again with PYTHON=/path/to/python3.12$([ "$python" = .venv/bin/python ] && echo ' after deleting .venv/')" >&2
                 exit 2 ;;
esac
# pip runs only when what it installs from changed since the last time it ran (a stamp per set in
# .venv/); delete .venv/setup_*.stamp to make it run again.
stamp=$(cat requirements.txt pyproject.toml <(echo "${TORCH_SPEC:-}") | sha256sum)
dev_stamp=$(cat requirements-dev.txt <(echo "$stamp") | sha256sum)
# The maintainer's set (--dev) is kept in a cache outside the checkout, as hard links (no second copy
# on disk while a .venv uses them), keyed by what it installs and by the Python: a new clone's .venv
# is linked from there in seconds instead of installed in one to two minutes, its scripts and its
# editable install pointed at the new checkout. Only a .venv this script created and installed whole
# is cached (never one changed by hand), and only the newest key is kept; a checkout on another file
# system installs as before. The learner's set is never cached.
venv_cache=${XDG_CACHE_HOME:-$HOME/.cache}/transformer-course/venvs
venv_key=venv-$( { echo "$dev_stamp"; "$python" -c 'import sys; print(sys.version, sys.base_prefix)'; uname -m; } \
                 | sha256sum | cut -c1-16)
link_cached_venv() {
    local cached=$venv_cache/$venv_key old
    [ -f "$cached/setup_dev.stamp" ] && [ -f "$cached/.source_root" ] || return 0
    old=$(cat "$cached/.source_root")
    rm -rf .venv.partial
    cp -al "$cached" .venv.partial 2>/dev/null || { rm -rf .venv.partial; return 0; }
    rm .venv.partial/.source_root
    # sed -i writes a new file, so the cache keeps its own copy of what changes here
    { grep -rlZF "$old" .venv.partial/bin .venv.partial/pyvenv.cfg .venv.partial/lib/python*/site-packages/__editable__* \
        .venv.partial/lib/python*/site-packages/transformer_lib-*.dist-info 2>/dev/null || true; } \
        | xargs -0 -r sed -i "s|$old|$PWD|g"
    rm -f .venv.partial/lib/python*/site-packages/__pycache__/__editable__*
    mv .venv.partial .venv
}
save_venv_to_cache() {
    local tmp
    [ -f "$venv_cache/$venv_key/setup_dev.stamp" ] && return 0
    mkdir -p "$venv_cache" && tmp=$(mktemp -d "$venv_cache/.partial.XXXXXX") || return 0
    if cp -al .venv/. "$tmp/" 2>/dev/null && echo "$PWD" > "$tmp/.source_root"; then
        find "$venv_cache" -mindepth 1 -maxdepth 1 -name 'venv-*' -exec rm -rf {} +
        mv -T "$tmp" "$venv_cache/$venv_key" 2>/dev/null || rm -rf "$tmp"    # another run saved it first
    else
        rm -rf "$tmp"
    fi
}
# A stamp is replaced, never rewritten in place: the cache may share its file.
write_stamp() { echo "$1" > "$2.new" && mv "$2.new" "$2"; }
[ "$dev" = 1 ] && [ ! -e .venv ] && link_cached_venv
created=0
[ -x .venv/bin/python ] || { "$python" -m venv .venv; created=1; }
# pip compiles every module to bytecode one file after another (40 s of a 97 s install on 2 cores);
# compileall does it on every core instead. The bytecode must be there: where PYTHONDONTWRITEBYTECODE
# is set (many containers set it), Python never writes it on import and would compile torch anew in
# every process.
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile "$@"; }
compile_venv() { .venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null || true; }
if [ "$(cat .venv/setup_learner.stamp 2>/dev/null)" != "$stamp" ]; then
    # shellcheck disable=SC2086
    pip_install ${TORCH_SPEC:-torch==2.13.0}
    pip_install -r requirements.txt -e .
    compile_venv
    write_stamp "$stamp" .venv/setup_learner.stamp
fi
[ "$dev" = 1 ] || exit 0
if [ "$(cat .venv/setup_dev.stamp 2>/dev/null)" != "$dev_stamp" ]; then
    pip_install -r requirements-dev.txt
    compile_venv
    write_stamp "$dev_stamp" .venv/setup_dev.stamp
    [ "$created" = 0 ] || save_venv_to_cache
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
