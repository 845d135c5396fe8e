"""Where the course's notebooks read and write files, wherever they run.

Hand-written, not exported: every notebook uses it, so no one notebook is its home. A notebook
runs in a checkout of the repository (`notebooks/`), on Colab (`/content`), or as a downloaded file
in any folder; `course_root()` finds the checkout when there is one and falls back to the current
folder, so no notebook writes a path like `../images` by hand.

Figures: `save_figure(fig, name)` writes `name` only when the environment variable
`COURSE_FIGURES_DIR` names a folder (only `scripts/run_course.sh --update-figures` points it at
`images/`; nothing a learner runs sets it), and only when the picture really changed, so running the tests never touches tracked
files and re-running the course leaves `git status` clean.

The course's model: `course_model(run_dir("course_model"))` is the small model of the built-in
corpus that notebook 11 trains and notebooks 12 and 13 decode with, trained (or resumed) by
`train_run` with `COURSE_MODEL` when the run folder does not hold it finished yet.
"""
import io
import os
from pathlib import Path

from transformer_lib.settings import TrainSettings

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


# The course's model of the built-in corpus, trained by notebook 11 and used by notebooks 12 and 13:
# the library's defaults (written out, so that they read here) but for smaller batches, a shorter
# warmup, a lower rate and 300 steps.
COURSE_MODEL = TrainSettings(data="builtin", vocab_size=1000, d_model=128, heads=4, d_ff=512, layers=2,
                             max_tokens=2048, warmup=200, lr_factor=0.7, max_steps=300, seed=0, progress=False)


def course_model(run: str | os.PathLike, device=None):
    """The course model (in eval mode) and its tokenizer from the run folder `run`, trained there
    first with `COURSE_MODEL` unless it is finished (an interrupted run resumes), then loaded
    by `train_run.load_run`, which checks that the folder's files belong together."""
    from transformer_lib import runs
    from transformer_lib.train_run import load_run, train_run
    run = Path(run)
    done = runs.RunFolder(run).exists() and (run / runs.CHECKPOINT).is_file() and runs.finished_reason(
        runs.read_checkpoint(run)["state"], COURSE_MODEL.max_steps, None)
    if not done or not (run / runs.HISTORY).is_file():    # notebook 11 plots history.json
        train_run(run, COURSE_MODEL, announce=False)  # a finished run: its summary, history.json if missing
    return load_run(run, device)


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
    from transformer_lib.files import write_atomic
    from transformer_lib.plotting import TEXT_SIZE_KEY, smallest_font_pt

    buffer = io.BytesIO()
    # No "Software" entry: the PNG's bytes then depend on the picture, not on matplotlib's version. The
    # smallest font goes in, as for the notebooks' own figures, so the site test can measure its text.
    smallest = smallest_font_pt(fig)
    metadata = {"Software": None} | ({TEXT_SIZE_KEY: f"{smallest:g}"} if smallest is not None else {})
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", metadata=metadata)
    path = Path(folder) / name
    if path.is_file() and not figure_changed(path.read_bytes(), buffer.getvalue()):
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda tmp: tmp.write_bytes(buffer.getvalue()))
    return path
