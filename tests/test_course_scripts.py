"""The README's main commands as a newcomer runs them: `scripts/run_course.sh` and
`scripts/start_course.sh` under a new, empty home folder (no Jupyter folders, no caches, nothing that
an earlier Jupyter program left behind), and `scripts/setup_env.sh`'s check of the Python version.
The scripts run for real, through bash, with only PATH and HOME set, as `env -i` would leave them."""
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the scripts are bash")


@pytest.fixture
def newcomer_env():
    """A new account's environment: an empty home and nothing of ours but PATH (and the choice of
    torch build and pip's settings, so that setup_env.sh sees the .venv it installed as current).
    The home's path is short, as a real one is (pytest's tmp_path would push Jupyter's runtime folder
    past the length kernel_sockets.sh allows a socket's folder)."""
    home = tempfile.mkdtemp(prefix="home-", dir="/tmp")
    keep = {k: v for k, v in os.environ.items() if k == "TORCH_SPEC" or k.startswith("PIP_")}
    yield {**keep, "PATH": os.environ["PATH"], "HOME": home, "OMP_NUM_THREADS": "1"}
    shutil.rmtree(home, ignore_errors=True)


def untouched_state() -> tuple:
    """What a course run could change in the checkout: the notebook it executes, the figures in
    images/, and new files that git does not ignore in the folders where a notebook runs and at the
    top (everything it writes must go to build/ or runs/). Other tests, running beside this one,
    write only where git ignores, but not always in these places."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return (git("ls-files", "--others", "--exclude-standard", "--", "notebooks", "images", ":(glob)*"), git("status", "--porcelain", "--", "images"),
            (ROOT / "notebooks" / "03_positional_encoding.ipynb").read_bytes())


def test_run_course_runs_a_notebook_on_a_new_account(newcomer_env):
    env = newcomer_env
    before = untouched_state()
    executed = ROOT / "build" / "notebooks" / "03_positional_encoding.ipynb"
    started = time.time()
    result = subprocess.run(["bash", "scripts/run_course.sh", "03"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    printed = result.stdout + result.stderr
    assert result.returncode == 0, printed
    assert "== notebooks/03_positional_encoding.ipynb ran in" in result.stdout, printed
    assert [line for line in printed.splitlines() if "warn" in line.lower()] == [], printed
    assert executed.stat().st_mtime >= started - 1
    outputs = [o for cell in json.loads(executed.read_text(encoding="utf-8"))["cells"]
               for o in cell.get("outputs", [])]
    assert outputs and [o for o in outputs if o.get("name") == "stderr" or o["output_type"] == "error"] == []
    # the kernel's sockets were made in Jupyter's runtime folder, which the script had to create
    runtime = Path(env["HOME"]) / (".local/share/jupyter/runtime" if sys.platform != "darwin"
                                   else "Library/Jupyter/runtime")
    assert runtime.is_dir()
    assert [p.name for p in runtime.iterdir()] == []  # made by the script, emptied by the kernel
    assert untouched_state() == before


def test_run_course_refuses_an_unknown_argument_in_one_line():
    for argument, said in (("99", "no notebook numbered 99"), ("--fast", "unknown argument '--fast'")):
        result = subprocess.run(["bash", "scripts/run_course.sh", argument], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert result.stdout == "" and result.stderr.startswith("run_course.sh: error: ")
        assert said in result.stderr and result.stderr.count("\n") == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int, token: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method="GET" if body is None else "POST",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return json.loads(text) if path.startswith("/api") else {"html": text}


async def execute(port: int, token: str, kernel_id: str, code: str) -> str:
    """Runs code in the kernel over Jupyter's websocket and returns what it printed."""
    from tornado.websocket import websocket_connect

    url = f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?token={token}"
    connection = await websocket_connect(url)
    msg_id, printed = uuid.uuid4().hex, ""
    header = {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
              "msg_type": "execute_request", "version": "5.3", "date": ""}
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}
    await connection.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {},
                                               "content": content, "channel": "shell", "buffers": []}))
    # The reply comes on the shell channel and the printed text on iopub, in no set order; the kernel
    # says "idle" on iopub after all of a request's output, so wait for both.
    reply, idle = None, False
    while reply is None or not idle:
        message = json.loads(await asyncio.wait_for(connection.read_message(), timeout=60))
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "stream":
            printed += message["content"]["text"]
        elif message["msg_type"] == "execute_reply":
            reply = message["content"]
        elif message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            idle = True
    connection.close()
    assert reply["status"] == "ok", reply
    return printed


def test_start_course_serves_jupyter_lab_and_a_kernel_answers(newcomer_env):
    env, port, token = newcomer_env, free_port(), "course-test-token"
    server = subprocess.Popen(
        ["bash", "scripts/start_course.sh", "--no-browser", f"--port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.communicate()[0]
            try:
                api(port, token, "/api/status")
                break
            except OSError:
                assert time.monotonic() < deadline, "Jupyter Lab did not answer within 120 s"
                time.sleep(0.5)
        assert "JupyterLab" in api(port, token, "/lab/tree/notebooks/00_course_map.ipynb")["html"]
        # what Jupyter Lab does when it opens notebook 00: a session, whose kernel runs in its folder
        session = api(port, token, "/api/sessions", {"path": "notebooks/00_course_map.ipynb",
                                                    "type": "notebook", "kernel": {"name": "python3"}})
        printed = asyncio.run(execute(port, token, session["kernel"]["id"],
                                      "import transformer_lib, os; print(6 * 7, os.getcwd())"))
        assert printed.split() == ["42", str(ROOT / "notebooks")]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output = server.communicate(timeout=60)[0]
    assert "Opening Jupyter Lab at notebooks/00_course_map.ipynb" in output
    assert "without encryption" not in output, output  # the kernel talked over IPC, not TCP


def kernel_sockets(home: str) -> list[str]:
    source = f"cd {ROOT} && source scripts/kernel_sockets.sh && printf '%s\\n' \"${{kernel_sockets[@]}}\""
    return subprocess.run(["bash", "-c", source], env={"PATH": os.environ["PATH"], "HOME": home},
                          capture_output=True, text=True, check=True).stdout.splitlines()


def test_kernel_sockets_live_in_jupyters_runtime_folder_or_a_short_private_one(tmp_path):
    short = tempfile.mkdtemp(prefix="h-", dir="/tmp")
    try:
        runtime = subprocess.run([str(ROOT / ".venv/bin/jupyter"), "--runtime-dir"], check=True, text=True,
                                 capture_output=True, env={"PATH": os.environ["PATH"], "HOME": short}).stdout.strip()
        assert not Path(runtime).exists()
        assert kernel_sockets(short) == ["--KernelManager.transport=ipc", f"--KernelManager.ip={runtime}/kernel-ipc"]
        assert Path(runtime).is_dir()
    finally:
        shutil.rmtree(short)
    long_home = tmp_path / ("a-home-folder-whose-path-is-long" * 2)
    options = kernel_sockets(str(long_home))
    folder = Path(options[1].removeprefix("--KernelManager.ip=")).parent
    try:
        assert folder.is_dir() and len(str(folder / "kernel-ipc-99999")) < 104
        assert folder.stat().st_mode & 0o777 == 0o700
    finally:
        folder.rmdir()


def fake_python(folder: Path, version: str) -> None:
    """A `python3` that reports this version, as an old system Python would."""
    folder.mkdir()
    script = folder / "python3"
    script.write_text(f"#!/bin/sh\necho {version}\n")
    script.chmod(0o755)


@pytest.mark.parametrize("version", ["3.9", "3.8", "2.7"])
def test_setup_env_refuses_an_old_python_in_one_line(tmp_path, version):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "setup_env.sh").write_text((ROOT / "scripts" / "setup_env.sh").read_text())
    fake_python(tmp_path / "bin", version)
    result = subprocess.run(["bash", "scripts/setup_env.sh"], cwd=tmp_path, capture_output=True,
                            text=True, env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"setup_env.sh: error: the course needs Python 3.10 or newer, and python3 is "
                             f"Python {version}; install a newer one and run again with "
                             "PYTHON=/path/to/python3.12\n")
    assert not (tmp_path / ".venv").exists()


def test_setup_env_says_when_there_is_no_python(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "setup_env.sh").write_text((ROOT / "scripts" / "setup_env.sh").read_text())
    result = subprocess.run(["bash", "scripts/setup_env.sh"], cwd=tmp_path, capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                            "PYTHON": "python3.99"})
    assert result.returncode == 2
    assert result.stderr.startswith("setup_env.sh: error: 'python3.99' not found; install Python 3.10")


def test_setup_env_checks_the_python_that_pyproject_requires():
    # read without tomllib, which Python 3.10 (on the unit matrix) lacks
    assert re.search(r'^requires-python = ">=3.10"$', (ROOT / "pyproject.toml").read_text(), re.M)
    script = (ROOT / "scripts" / "setup_env.sh").read_text()
    assert "needs Python 3.10 or newer" in script and re.search(r"2\.\*\|3\.\[0-9\]\)", script)


FAKE_PYTHON = r"""#!/bin/sh
# A python3 for setup_env.sh's cache test: venv and pip only write what the real ones write about paths.
case "$1" in
  -c) case "$2" in *version_info*) echo 3.11 ;; *) echo "3.11.7 /opt/fake-python" ;; esac ;;
  -m) case "$2" in
        venv) mkdir -p "$3/bin" "$3/lib/python3.11/site-packages"
              ln -s "$0" "$3/bin/python"
              echo "command = python3 -m venv $PWD/$3" > "$3/pyvenv.cfg" ;;
        pip) echo "$*" >> "$HOME/pip.log"
             echo "#!$PWD/.venv/bin/python" > .venv/bin/pytest
             echo "MAPPING = {'transformer_lib': '$PWD/transformer_lib'}" \
                 > .venv/lib/python3.11/site-packages/__editable___transformer_lib_0_1_0_finder.py ;;
      esac ;;
esac
"""


def test_setup_env_links_a_new_clones_venv_from_the_cache(tmp_path):
    """The first clone installs and caches its .venv; the second is linked from the cache, without pip,
    its scripts and editable install pointed at itself, while the cache keeps the first clone's."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(FAKE_PYTHON)
    (tmp_path / "bin" / "python3").chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "CHROMIUM_PATH": "/bin/true"}
    clones = []
    for name in ("first", "second"):
        clone = tmp_path / name
        (clone / "scripts").mkdir(parents=True)
        (clone / "docs" / "node_modules").mkdir(parents=True)
        for file in ("scripts/setup_env.sh", "requirements.txt", "requirements-dev.txt", "pyproject.toml",
                     "docs/package-lock.json"):
            shutil.copy(ROOT / file, clone / file)
        shutil.copy(clone / "docs" / "package-lock.json", clone / "docs" / "node_modules" / ".package-lock.json")
        result = subprocess.run(["bash", "scripts/setup_env.sh", "--dev"], cwd=clone, env=env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and result.stderr == "", result.stdout + result.stderr
        clones.append(clone)
    installs = (tmp_path / "pip.log").read_text().splitlines()
    assert len(installs) == 3 and all(line.startswith("-m pip install") for line in installs)   # the first only
    [cached] = (tmp_path / ".cache" / "transformer-course" / "venvs").glob("venv-*")
    first, second = clones
    assert (cached / ".source_root").read_text().strip() == str(first)
    finder = "lib/python3.11/site-packages/__editable___transformer_lib_0_1_0_finder.py"
    for venv, clone in ((cached, first), (first / ".venv", first), (second / ".venv", second)):
        assert (venv / "bin" / "pytest").read_text() == f"#!{clone}/.venv/bin/python\n"
        assert str(clone / "transformer_lib") in (venv / finder).read_text()
    # linked, not copied: a file that needed no change is the cache's own
    assert (second / ".venv" / "setup_dev.stamp").stat().st_ino == (cached / "setup_dev.stamp").stat().st_ino
    assert not (second / ".venv" / ".source_root").exists()
