"""Rewrite every notebook's Colab badge and setup cell from the repository URL in pyproject.toml.

`python scripts/sync_notebook_headers.py` after the project moves; tests/test_notebook_conventions.py
fails when a badge or setup cell names another URL. Only those two places are touched, so stored
outputs stay as they are.
"""
import json
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10, which the package supports: the one entry is read by hand
    tomllib = None

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_FOLDERS = ("notebooks", "solutions")
BADGE = re.compile(r"\[!\[Open In Colab\]\(https://colab\.research\.google\.com/assets/colab-badge\.svg\)\]"
                   r"\(https://colab\.research\.google\.com/github/[^)]*\)")
SETUP_MARK = 'if "google.colab" in sys.modules:'


def repository_url() -> str:
    """The `Repository` entry of `[project.urls]` in pyproject.toml, without a trailing slash."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    if tomllib is not None:
        return tomllib.loads(text)["project"]["urls"]["Repository"].rstrip("/")
    entry = re.search(r'^\[project\.urls\][^\[]*?^Repository\s*=\s*"([^"]+)"', text, re.MULTILINE | re.DOTALL)
    if entry is None:
        raise SystemExit("pyproject.toml has no Repository entry under [project.urls]")
    return entry.group(1).rstrip("/")


def badge(notebook: Path) -> str:
    """The Colab badge of `notebook` (a path relative to the repository root)."""
    github = repository_url().removeprefix("https://github.com/")
    return ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{github}/blob/main/{notebook.as_posix()})")


def setup_source() -> str:
    """The setup cell: installs the course package on Colab, does nothing anywhere else."""
    return ("# On Colab, install the course package; locally (repo checkout, `pip install -e .`) this does nothing.\n"
            "import sys\n"
            f"{SETUP_MARK}\n"
            "    import subprocess\n"
            '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",\n'
            f'                    "git+{repository_url()}"], check=True)')


def expected_header_problems(path: Path) -> list[str]:
    """What is wrong with the badge and the setup cell of the notebook at `path` (empty: all right)."""
    relative = path.resolve().relative_to(ROOT)
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    problems = []
    badges = [m.group(0) for c in cells if c["cell_type"] == "markdown" for m in BADGE.finditer("".join(c["source"]))]
    if badges != [badge(relative)]:
        problems.append(f"{relative}: expected one Colab badge {badge(relative)}, found {badges}")
    setups = ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and SETUP_MARK in "".join(c["source"])]
    if setups != [setup_source()]:
        problems.append(f"{relative}: the Colab setup cell must read exactly:\n{setup_source()}")
    return problems


def sync(path: Path) -> bool:
    """Rewrite the badge and setup cell of one notebook; True if the file changed."""
    relative = path.resolve().relative_to(ROOT)
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            source = BADGE.sub(lambda _: badge(relative), source)
        elif SETUP_MARK in source:
            source = setup_source()
        cell["source"] = source.splitlines(keepends=True)
    new_text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    if new_text != text:
        path.write_text(new_text, encoding="utf-8")
    return new_text != text


def all_notebooks() -> list[Path]:
    return sorted(p for folder in NOTEBOOK_FOLDERS for p in (ROOT / folder).glob("[0-9][0-9]_*.ipynb"))


if __name__ == "__main__":
    changed = [p for p in all_notebooks() if sync(p)]
    for path in changed:
        print("rewrote", path.relative_to(ROOT))
    sys.exit(0)
