"""The notebooks run where a learner runs them: Colab, or a downloaded notebook in an empty folder.

The package is built as a wheel from a copy of the sources, installed into a fresh virtual
environment outside the checkout, and every notebook and solution is copied into an empty folder
and executed there, top to bottom, by that environment's kernel. Nothing of the repository is
importable or on disk for them: a path like `../images`, an exercise that reads `tests/`, or a module
that pip does not install fails here. Slow (a venv and a full run of the course): about 5 minutes.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What the wheel is built from: if the package needs another file of the checkout, this test fails.
WHEEL_SOURCES = ["pyproject.toml", "README.md", "transformer_lib"]
EXECUTE = """
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

folder = Path(sys.argv[1])
for name in sys.argv[2:]:
    notebook = nbformat.read(folder / name, as_version=4)
    NotebookClient(notebook, timeout=1800, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    print("ran", name, flush=True)
"""


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


@pytest.fixture(scope="module")
def learner_python(tmp_path_factory) -> Path:
    """A fresh venv outside the checkout with only the built wheel (and a Jupyter kernel) installed."""
    build = tmp_path_factory.mktemp("wheel_sources")
    for name in WHEEL_SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, build / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, build / name)
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(build)])
    wheels = list(dist.glob("transformer_lib-*.whl"))
    assert len(wheels) == 1, f"expected one wheel, got {wheels}"

    venv = tmp_path_factory.mktemp("learner_venv")
    run([sys.executable, "-m", "venv", "--clear", str(venv)])
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # The same torch build as the course's own venv (scripts/setup_env.sh), then the wheel with its
    # declared dependencies, then what Colab/Jupyter provide: a kernel and a notebook runner.
    run([*pip, *os.environ.get("TORCH_SPEC", "torch==2.13.0").split()])
    run([*pip, str(wheels[0]), "nbclient", "nbformat", "ipykernel"])
    return python


def learner_env() -> dict:
    """The environment of a learner: no checkout on the path, no course-run settings, offline hub."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "COURSE_FIGURES_DIR", "MULTI30K_DIR", "VIRTUAL_ENV"}}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def test_installed_package_is_the_wheel_not_the_checkout(learner_python, tmp_path):
    result = run([str(learner_python), "-c", "import transformer_lib, transformer_lib.exercises, "
                  "transformer_lib.course as c; print(transformer_lib.__file__); print(c.course_root())"],
                 cwd=tmp_path, env=learner_env())
    package_file, root = result.stdout.split()
    assert "site-packages" in package_file and not package_file.startswith(str(ROOT))
    assert Path(root) == tmp_path, "outside a checkout, the course's files go to the current folder"


def test_every_notebook_and_solution_runs_in_an_empty_folder(learner_python, tmp_path):
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    solutions = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    folder = tmp_path / "learner"
    folder.mkdir()
    names = []
    for path in notebooks + solutions:
        name = path.name if path in notebooks else f"solution_{path.name}"
        shutil.copy2(path, folder / name)
        names.append(name)
    result = run([str(learner_python), "-c", EXECUTE, str(folder), *names], cwd=folder, env=learner_env(),
                 timeout=3600)
    assert result.stdout.split().count("ran") == len(names)
    assert not (folder / "images").exists(), "no figure may be written unless the course run asks for it"
    assert (folder / "runs" / "course_model").is_dir(), "notebook 11 saves the course model beside the notebooks"
