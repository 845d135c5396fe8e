"""Where the course's notebooks read and write files, wherever they run.

Hand-written, not exported: every notebook uses it, so no one notebook is its home. A notebook
runs in a checkout of the repository (`notebooks/`), on Colab (`/content`), or as a downloaded file
in any folder; `course_root()` finds the checkout when there is one and falls back to the current
folder, so no notebook writes a path like `../images` by hand.

Figures: `save_figure(fig, name)` writes `name` only when the environment variable
`COURSE_FIGURES_DIR` names a folder (the course run, `scripts/run_course.sh`, points it at
`images/`), and only when the picture really changed, so running the tests never touches tracked
files and re-running the course leaves `git status` clean.
"""
import io
import os
from pathlib import Path

FIGURES_ENV = "COURSE_FIGURES_DIR"
# A saved figure is rewritten only if more than this share of its pixels moved by more than
# PIXEL_TOLERANCE (of 1.0): anti-aliasing noise from another matplotlib or CPU is not a change.
CHANGED_PIXEL_SHARE = 1e-3
PIXEL_TOLERANCE = 8 / 255


def course_root(start: Path | None = None) -> Path:
    """The repository checkout that holds `start` (default: the current folder), else `start`."""
    start = Path.cwd() if start is None else Path(start)
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "transformer_lib").is_dir() \
                and (folder / "notebooks").is_dir():
            return folder
    return start


def run_dir(name: str = "course_model") -> Path:
    """Folder for a training run: `runs/<name>` under the checkout, or under the current folder."""
    return course_root() / "runs" / name


def results_dir(name: str) -> Path | None:
    """The committed results folder `results/<name>` of the checkout, or None outside one."""
    folder = course_root() / "results" / name
    return folder if folder.is_dir() else None


def _pixels(png: bytes):
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(png), format="png")


def figure_changed(old_png: bytes, new_png: bytes) -> bool:
    """True when two PNGs differ in size or in more than a speck of visibly different pixels."""
    if old_png == new_png:
        return False
    old, new = _pixels(old_png), _pixels(new_png)
    if old.shape != new.shape:
        return True
    moved = (abs(old - new) > PIXEL_TOLERANCE).any(axis=-1)      # (H, W): pixel visibly different
    return moved.mean() > CHANGED_PIXEL_SHARE


def save_figure(fig, name: str, dpi: int = 100) -> Path | None:
    """Save `fig` as `$COURSE_FIGURES_DIR/name` if that variable is set and the picture changed.

    Returns the path written, or None when nothing was written (no folder asked for, or the stored
    picture already shows the same thing).
    """
    folder = os.environ.get(FIGURES_ENV)
    if not folder:
        return None
    buffer = io.BytesIO()
    # No "Software" entry: the PNG's bytes then depend on the picture, not on matplotlib's version.
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    path = Path(folder) / name
    if path.is_file() and not figure_changed(path.read_bytes(), buffer.getvalue()):
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return path
