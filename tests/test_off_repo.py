"""The notebooks run where a learner runs them, and their stored outputs hold on another CPU family.

The package is built as a wheel from a copy of the sources, installed into a fresh virtual
environment outside the checkout, and every notebook is copied into an empty folder and run there,
top to bottom, by that environment's kernel under strict nbval; the solutions likewise, in a folder
of their own. Nothing of the repository is importable or on disk for them: a path like `../images`,
an exercise that reads `tests/`, or a module that pip does not install fails here.

The same run is the portability check: the kernels use another CPU family's kernels (AVX2 instead of
AVX-512/AMX, in oneDNN and in ATen) and one thread, so every stored output must also reproduce where
torch computes with other kernels than the machine that stored it. One execution serves both checks,
and it is the test command's only run of the notebooks (since 2026-11-27: a second, native run in the
checkout doubled the CI's time and checked nothing this one does not; `scripts/test_gpu.sh` runs them
in the checkout on a GPU). Slow: minutes each.

The venv is installed without an index, from wheels that the first run downloads into a cache
outside the checkout (`$XDG_CACHE_HOME/transformer-course/wheels`, default `~/.cache/...`). The cache
is keyed by what is asked for (torch, the wheel's declared dependencies, the kernel, this Python)
and by the week, so the dependencies' new releases still reach this test within a week.
"""
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What the wheel is built from: if the package needs another file of the checkout, this test fails.
WHEEL_SOURCES = ["pyproject.toml", "README.md", "transformer_lib"]
# Another CPU family's kernels and one thread: what the stored outputs must survive besides a GPU.
OTHER_KERNELS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"}
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


# What Colab and Jupyter provide beside the course's own dependencies: a kernel and a notebook runner,
# here strict nbval (pinned as in requirements-dev.txt), which runs each notebook and compares its outputs.
KERNEL = ["nbclient", "nbformat", "ipykernel", "ipywidgets", "pytest>=8.0", "nbval==0.11.0"]
# A cell tagged so shows what the checkout holds (the committed Multi30k results, results/multi30k):
# the notebooks' folder gets a copy of them, so those cells print what they print in the checkout and
# are compared like every other cell. (A notebook downloaded alone prints that there is nothing to show.)
FROM_CHECKOUT = "from-checkout"
CHECKOUT_RESULTS = "results/multi30k"


def wheel_cache_key(course_wheel: Path, torch_spec: list[str]) -> str:
    """What the learner venv installs, as a file name: torch, the wheel's dependencies, the kernel,
    this Python and platform, and the week (so new releases of the dependencies get in)."""
    with zipfile.ZipFile(course_wheel) as wheel:
        metadata = next(name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
        requires = sorted(line for line in wheel.read(metadata).decode().splitlines()
                          if line.startswith("Requires-Dist:"))
    asked = [*torch_spec, *requires, *KERNEL, sys.version, sys.platform, platform.machine()]
    digest = hashlib.sha256("\n".join(asked).encode()).hexdigest()[:16]
    return f"{time.strftime('%G-W%V')}-{digest}"


def torch_pin(folder: Path) -> str:
    """`torch==VERSION` for the one torch wheel in `folder`."""
    wheels = list(folder.glob("torch-*.whl"))
    assert len(wheels) == 1, f"expected one torch wheel in {folder}, got {wheels}"
    return f"torch=={wheels[0].name.split('-')[1]}"


def filled_wheel_cache(course_wheel: Path, torch_spec: list[str]) -> Path:
    """The cache folder holding a wheel of torch and of everything else the learner venv needs
    (not the course's wheel, which is built fresh every run); downloaded on the first run."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transformer-course" / "wheels"
    folder = root / wheel_cache_key(course_wheel, torch_spec)
    if folder.is_dir():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))   # renamed once complete
    try:
        pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "-w", str(partial)]
        run([*pip_wheel, *torch_spec])
        # The rest against that torch build: the wheel's dependencies name torch too.
        run([*pip_wheel, "--find-links", str(partial), torch_pin(partial), str(course_wheel), *KERNEL])
        (partial / course_wheel.name).unlink()
        for old in root.iterdir():       # last week's, or those of other requirements
            if old.name != folder.name and not old.name.startswith(".partial-"):
                shutil.rmtree(old, ignore_errors=True)
        partial.rename(folder)
    except OSError:
        if not folder.is_dir():          # another run filled it at the same time: use theirs
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


@pytest.fixture(scope="module")
def learner_python(tmp_path_factory) -> Path:
    """A fresh venv outside the checkout with only the built wheel (and a Jupyter kernel) installed.

    One per test run: the notebooks and the solutions run on two workers, and the second waits for the
    first one's venv instead of installing its own (about a minute of CPU on the shared cores)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return install_learner_venv(tmp_path_factory.mktemp("learner"))
    import fcntl                                   # POSIX; this test does not run on Windows (CONTRIBUTING)
    shared = tmp_path_factory.getbasetemp().parent / "learner"   # the run's folder, common to its workers
    shared.mkdir(exist_ok=True)
    with open(shared.parent / "learner.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # released when the file closes, also on an error
        built = shared / "python.txt"
        if not built.is_file():
            built.write_text(str(install_learner_venv(shared)))
        return Path(built.read_text())


def install_learner_venv(root: Path) -> Path:
    """Build the course's wheel from a copy of its sources and install it, with torch and a kernel, into
    a new venv under `root`; return the venv's python."""
    build, dist, venv = root / "wheel_sources", root / "dist", root / "learner_venv"
    build.mkdir()
    for name in WHEEL_SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, build / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, build / name)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(build)])
    wheels = list(dist.glob("transformer_lib-*.whl"))
    assert len(wheels) == 1, f"expected one wheel, got {wheels}"

    # The same torch build as the course's own venv (scripts/setup_env.sh), then the wheel with its
    # declared dependencies, then what Colab/Jupyter provide: all from the cache, none from an index.
    torch_spec = os.environ.get("TORCH_SPEC", "torch==2.13.0").split()
    cache = filled_wheel_cache(wheels[0], torch_spec)
    run([sys.executable, "-m", "venv", "--clear", str(venv)])
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # --no-compile: the kernels compile what they import; compiling all of torch up front is slow.
    run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-compile",
         "--find-links", str(cache), torch_pin(cache), str(wheels[0]), *KERNEL])
    return python


def learner_env() -> dict:
    """The environment of a learner: no checkout on the path, no course-run settings, offline hub.
    Without PYTHONDONTWRITEBYTECODE (CI's machine sets it): the venv is installed without bytecode, so
    with it every kernel would compile torch anew (the notebooks' run took 401 s instead of about 250)."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "COURSE_FIGURES_DIR", "MULTI30K_DIR", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE"}}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def test_installed_package_is_the_wheel_not_the_checkout(learner_python, tmp_path):
    result = run([str(learner_python), "-c", "import transformer_lib, transformer_lib.exercises, "
                  "transformer_lib.course as c; print(transformer_lib.__file__); print(c.course_root())"],
                 cwd=tmp_path, env=learner_env())
    package_file, root = result.stdout.split()
    assert "site-packages" in package_file and not package_file.startswith(str(ROOT))
    assert Path(root) == tmp_path, "outside a checkout, the course's files go to the current folder"


def test_only_cells_that_read_the_checkouts_results_are_tagged():
    tagged = {(path.name, number) for kind in ("notebooks", "solutions")
              for path in sorted((ROOT / kind).glob("[0-9][0-9]_*.ipynb"))
              for number, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"])
              if FROM_CHECKOUT in cell.get("metadata", {}).get("tags", [])}
    assert {name for name, _ in tagged} == {"13_evaluation.ipynb"} and len(tagged) <= 4, tagged


@pytest.mark.parametrize("kind", ["notebooks", "solutions"])
def test_every_notebook_runs_in_an_empty_folder(kind, learner_python, tmp_path):
    """The notebooks, in order, in one empty folder (notebook 11 trains the model that 12 and 13
    load), under strict nbval on other CPU kernels; the solutions likewise in another. Two tests, so
    the test command's workers run them side by side (tests/conftest.py gives the solutions a unit of
    their own)."""
    folder = tmp_path / "learner"
    folder.mkdir()
    names = []
    for path in sorted((ROOT / kind).glob("[0-9][0-9]_*.ipynb")):
        shutil.copy2(path, folder / path.name)
        names.append(path.name)
    if kind == "notebooks":
        shutil.copytree(ROOT / CHECKOUT_RESULTS, folder / CHECKOUT_RESULTS)
    shutil.copy2(SANITIZE, tmp_path / SANITIZE.name)
    env = {**learner_env(), **OTHER_KERNELS, "PYTHONHASHSEED": "0"}
    result = subprocess.run([str(learner_python), "-m", "pytest", *names, "--nbval", "--nbval-current-env",
                             "--nbval-sanitize-with", str(tmp_path / SANITIZE.name), "-p", "no:cacheprovider",
                             "-q", "-rf", "--no-header"],
                            cwd=folder, env=env, capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, f"strict nbval off the checkout, on other CPU kernels:\n{result.stdout[-6000:]}"
    code_cells = sum(cell["cell_type"] == "code" for name in names
                     for cell in json.loads((folder / name).read_text(encoding="utf-8"))["cells"])
    summary = result.stdout.strip().splitlines()[-1]
    assert re.match(rf"{code_cells} passed in ", summary), f"every code cell checked: {summary}"
    assert not (folder / "images").exists(), "no figure may be written unless the course run asks for it"
    if kind == "notebooks":
        assert (folder / "runs" / "course_model").is_dir(), "notebook 11 saves the course model beside the notebooks"
