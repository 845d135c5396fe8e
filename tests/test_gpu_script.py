"""scripts/test_gpu.sh, the one GPU check, tested without a GPU: it stops with one line and exit code 2
where torch has no CUDA; and, with torch told that a GPU is present (a sitecustomize that fakes
torch.cuda's answers), it runs both parts and writes results/gpu's summary with the right counts."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "test_gpu.sh"
# The script is for Linux GPU machines: it needs bash 4 (mapfile) and GNU date; macOS has bash 3.2.
LINUX = pytest.mark.skipif(sys.platform != "linux", reason="scripts/test_gpu.sh runs on Linux")

FAKE_GPU = textwrap.dedent("""\
    # Makes this Python believe it has one CUDA device: the answers scripts/test_gpu.sh reads.
    import types
    import torch
    torch.version.cuda = "99.9"
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_name = lambda device=None: "Fake GPU for a test"
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=80 * 2 ** 30)
    """)


def run_script(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


@LINUX
def test_the_script_parses():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@LINUX
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_one_line_and_exit_code_2(tmp_path):
    done = run_script(env={"GPU_RESULTS_DIR": str(tmp_path / "gpu")}, timeout=60)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("test_gpu.sh: error: ")
    assert ("built without CUDA" if torch.version.cuda is None else "no CUDA device visible") in lines[0]
    assert not (tmp_path / "gpu").exists()                  # nothing ran, so no summary


@LINUX
def test_wheels_dir_without_wheels_is_refused(tmp_path):
    env = {"PYTHON": "", "WHEELS_DIR": str(tmp_path)}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == 2
    assert done.stderr.strip() == f"test_gpu.sh: error: WHEELS_DIR={tmp_path} holds no .whl files"


def _wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel (one empty package), enough for pip to install offline."""
    import zipfile
    path = folder / "gpu_check_probe-0.1-py3-none-any.whl"
    info = "gpu_check_probe-0.1.dist-info"
    files = {"gpu_check_probe/__init__.py": "",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


@LINUX
def test_wheels_dir_installs_offline_then_checks_the_device(tmp_path):
    """The lent GPU machine's setup: the system python3 plus the wheels of WHEELS_DIR, installed offline
    into build/gpu-site. Here python3 has no CUDA torch (or none at all), so it then stops with one line."""
    if subprocess.run(["python3", "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("python3 here has no pip")
    if subprocess.run(["python3", "-c", "import torch; assert torch.cuda.is_available()"],
                      capture_output=True).returncode == 0:
        pytest.skip("python3 here has CUDA")
    _wheel(tmp_path)
    env = {**os.environ, "PYTHON": "", "WHEELS_DIR": str(tmp_path), "GPU_RESULTS_DIR": str(tmp_path / "gpu")}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 1 and lines[0].startswith("test_gpu.sh: error: "), lines
    assert (REPO / "build" / "gpu-site" / "gpu_check_probe" / "__init__.py").is_file()   # the wheel went in
    assert not (tmp_path / "gpu").exists()
    shutil.rmtree(REPO / "build" / "gpu-site")


def fake_gpu_run(tmp_path, *pytest_args):
    pytest.importorskip("nbval")                       # the script's first run is nbval's
    if importlib.util.find_spec("xdist"):              # in this process: workers on 2 cores take minutes here
        pytest_args = ("-n", "0", *pytest_args)
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "sitecustomize.py").write_text(FAKE_GPU)
    pythonpath = os.pathsep.join(filter(None, [str(tmp_path / "fake"), os.environ.get("PYTHONPATH")]))
    done = run_script(*pytest_args, env={"PYTHONPATH": pythonpath, "GPU_RESULTS_DIR": str(tmp_path / "gpu")})
    summary = tmp_path / "gpu" / "summary.json"
    return done, json.loads(summary.read_text()) if summary.is_file() else None


@LINUX
def test_summary_with_a_faked_gpu(tmp_path):
    # -k narrows both runs: no notebook cell, and the 8 CUDA-capability cases of tests/test_amp.py.
    done, summary = fake_gpu_run(tmp_path, "-k", "test_cuda_choice_follows_the_compute_capability")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert summary["status"] == "passed"
    assert (summary["gpu"], summary["capability"], summary["cuda"]) == ("Fake GPU for a test", "9.0", "99.9")
    assert summary["torch"] == torch.__version__ and summary["gpu_memory_gib"] == 80.0
    unit, nbval = summary["parts"]["unit"], summary["parts"]["nbval"]
    assert (unit["passed"], unit["failed"], unit["errors"], unit["exit_code"]) == (8, 0, 0, 0)
    assert (nbval["passed"], nbval["exit_code"]) == (0, 5)          # 5: pytest collected nothing
    assert summary["command"].endswith("-k test_cuda_choice_follows_the_compute_capability")
    assert summary["date_utc"].endswith("Z") and summary["wall_seconds"] > 0
    markdown = (tmp_path / "gpu" / "summary.md").read_text()
    assert markdown.startswith("# GPU check: passed") and "Fake GPU for a test (capability 9.0" in markdown
    assert "| the unit tests' CUDA variants | 8 | 0 | 0 |" in markdown
    assert sorted(p.name for p in (tmp_path / "gpu").iterdir()) == ["summary.json", "summary.md"]   # no temp files


@LINUX
def test_a_run_where_nothing_passed_fails(tmp_path):
    done, summary = fake_gpu_run(tmp_path, "-k", "no_test_has_this_name")
    assert done.returncode == 1
    assert summary["status"] == "failed"
    assert all(part["passed"] == 0 for part in summary["parts"].values())


def test_the_workflow_gpu_job_runs_exactly_the_script():
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())["jobs"]["gpu"]
    assert "gpu" in job["runs-on"] and "self-hosted" in job["runs-on"]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs == ["bash scripts/test_gpu.sh"]
    upload = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["with"]["path"] == "results/gpu/" and upload["if"] == "always()"
