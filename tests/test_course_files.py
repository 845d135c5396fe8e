"""transformer_lib.course.save_figure: a figure goes to $COURSE_FIGURES_DIR only when asked and only when
its picture changed, whole (never a half-written PNG), recording its smallest font for the site test."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from transformer_lib.course import FIGURES_ENV, save_figure  # noqa: E402
from transformer_lib.plotting import TEXT_SIZE_KEY  # noqa: E402


def figure(label: str, fontsize: float = 13):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    ax.set_title(label, fontsize=fontsize)
    ax.tick_params(labelsize=fontsize)
    return fig


def test_nothing_written_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(FIGURES_ENV, raising=False)
    assert save_figure(figure("a"), "a.png") is None


def test_written_whole_with_its_smallest_font_then_only_when_changed(tmp_path, monkeypatch):
    monkeypatch.setenv(FIGURES_ENV, str(tmp_path))
    path = save_figure(figure("a"), "a.png")
    assert path == tmp_path / "a.png" and sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]
    assert Image.open(path).text[TEXT_SIZE_KEY] == "13"
    assert save_figure(figure("a"), "a.png") is None                      # the same picture: left alone
    assert save_figure(figure("a completely different title"), "a.png") == path
    plt.close("all")
