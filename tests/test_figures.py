"""Figures a phone can read, checked on the committed notebooks (no kernel needed).

On a 390 px phone the course website shows a figure at most PHONE_FIGURE_CSS_PX wide; its smallest
text must then be at least MIN_TEXT_CSS_PX tall (transformer_lib/plotting.py has the rule and the
style). Every notebook draws with `use_course_style()`, which makes SMALLEST_FONT_PT the smallest
font and records, in each stored PNG, the smallest font the figure really uses; these tests read
that record and the PNG's width and dpi, so they measure the stored figures, not a promise.
"""
import base64
import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from transformer_lib.plotting import MIN_TEXT_CSS_PX, SMALLEST_FONT_PT, TEXT_SIZE_KEY, text_css_px

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# Notebooks whose figures are still drawn in matplotlib's default style (smaller text): none now
# (11 and 12 were the last); a notebook named here is left out of the tests below.
UNSTYLED: set[str] = set()
# Figures that stay too dense for a phone and open full size on a tap: none drawn by a styled notebook.
# A picture a notebook only displays from a file (`Image(filename=...)`) was drawn elsewhere and is not counted.
FONT_SETTING = re.compile(r"\b(?:fontsize|labelsize|size)\s*=\s*([^,)\s]+)")
SMALLER_NAMES = {'"xx-small"', '"x-small"', '"small"', '"smaller"', "'xx-small'", "'x-small'", "'small'", "'smaller'"}


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def png_facts(png: bytes) -> tuple[int, float, dict]:
    """Width in pixels, dpi (from the pHYs chunk) and the tEXt entries of a PNG."""
    image = Image.open(io.BytesIO(png))
    width, height = image.size
    return width, image.info.get("dpi", (72.0, 72.0))[0], dict(image.text)


def stored_figures(path: Path):
    """(code cell number, PNG bytes) of every figure a notebook draws itself."""
    for number, cell in enumerate(c for c in cells(path) if c["cell_type"] == "code"):
        shows_files = "Image(filename" in "".join(cell["source"])
        for output in cell.get("outputs", []):
            if "image/png" in output.get("data", {}):
                png = base64.b64decode(output["data"]["image/png"])
                if not (shows_files and TEXT_SIZE_KEY not in png_facts(png)[2]):   # not a picture from a file
                    yield number, png


STYLED = [p for p in NOTEBOOKS if p.name not in UNSTYLED]


@pytest.mark.parametrize("path", STYLED, ids=[p.name for p in STYLED])
def test_no_code_cell_asks_for_a_font_smaller_than_the_course_minimum(path):
    for number, cell in enumerate(c for c in cells(path) if c["cell_type"] == "code"):
        for value in FONT_SETTING.findall("".join(cell["source"])):
            assert value not in SMALLER_NAMES, f"code cell {number}: a font size of {value}"
            if re.fullmatch(r"\d+(\.\d+)?", value):
                assert float(value) >= SMALLEST_FONT_PT, \
                    f"code cell {number}: a font size of {value} pt, below the course's {SMALLEST_FONT_PT}"


def test_the_drawing_helpers_ask_for_no_smaller_font():
    helpers = (ROOT / "transformer_lib" / "plotting.py").read_text(encoding="utf-8")
    sizes = [float(v) for v in FONT_SETTING.findall(helpers) if re.fullmatch(r"\d+(\.\d+)?", v)]
    assert sizes and min(sizes) >= SMALLEST_FONT_PT, sizes


@pytest.mark.parametrize("path", STYLED, ids=[p.name for p in STYLED])
def test_stored_figures_are_readable_on_a_phone(path):
    for number, png in stored_figures(path):
        width, dpi, text = png_facts(png)
        assert TEXT_SIZE_KEY in text, (f"code cell {number}: a figure drawn without use_course_style() "
                                       "(no smallest font recorded); call it after %matplotlib inline")
        smallest = text_css_px(float(text[TEXT_SIZE_KEY]), width, dpi)
        assert smallest >= MIN_TEXT_CSS_PX, (
            f"code cell {number}: its smallest text is {smallest:.1f} CSS px on a phone ({text[TEXT_SIZE_KEY]} pt "
            f"in a {width} px wide PNG at {dpi:.0f} dpi); draw it narrower (one panel a row) or with larger text")


def test_every_styled_notebook_with_figures_stores_some():
    """The phone test above must have something to measure: the styled notebooks hold most figures."""
    measured = sum(1 for path in STYLED for _ in stored_figures(path))
    assert measured >= 32, f"only {measured} figures measured"
