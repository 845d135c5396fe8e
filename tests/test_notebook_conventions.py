"""The notebooks' house rules, checked on the committed files (no kernel needed): markers nbval
really honours, Colab headers from the one repository URL, no paths that break outside the repo,
short teaching cells, checks that raise, cross-references as links, exercises with checkers."""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from sync_notebook_headers import all_notebooks, expected_header_problems  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
ALL = all_notebooks()
NBVAL_MARKERS = {"NBVAL_IGNORE_OUTPUT", "NBVAL_CHECK_OUTPUT", "NBVAL_RAISES_EXCEPTION", "NBVAL_SKIP"}
MAX_CELL_LINES = 40
MARKDOWN_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")


def cells(path: Path, kind: str | None = None) -> list[dict]:
    found = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [c for c in found if kind is None or c["cell_type"] == kind]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def ids(paths):
    return [f"{p.parent.name}/{p.name}" for p in paths]


def test_there_are_notebooks_and_solutions():
    assert len(NOTEBOOKS) >= 14
    assert [p.name for p in SOLUTIONS] == [p.name for p in NOTEBOOKS if p.name[:2] != "00"], \
        "every notebook 01-13 needs solutions/<same name>.ipynb"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_nbval_markers_are_ones_nbval_recognises(path):
    """nbval honours a marker only when the comment is the marker alone: `# NBVAL_IGNORE_OUTPUT`."""
    for number, cell in enumerate(cells(path, "code")):
        for line in source(cell).splitlines():
            stripped = line.strip()
            if stripped.startswith("#") and "NBVAL" in stripped.upper():
                assert stripped.lstrip("#").strip() in NBVAL_MARKERS, (
                    f"cell {number}: nbval ignores {stripped!r}; write the marker alone on its line "
                    f"(one of {sorted(NBVAL_MARKERS)}) and put the reason on the line above")
        assert "NBVAL_SKIP" not in source(cell), f"cell {number}: NBVAL_SKIP hides a cell from CI"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_colab_header_comes_from_the_repository_url(path):
    assert expected_header_problems(path) == [], "run `python scripts/sync_notebook_headers.py`"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_no_paths_that_break_outside_the_repository(path):
    """Colab and a downloaded notebook have no ../images: figures and runs go through transformer_lib.course."""
    for number, cell in enumerate(cells(path, "code")):
        text = source(cell)
        assert '"../' not in text and "'../" not in text, f"cell {number}: a path through '../'"
        assert ".savefig(" not in text, f"cell {number}: save figures with transformer_lib.course.save_figure"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_executed_top_to_bottom_without_stderr(path):
    code = [c for c in cells(path, "code") if source(c).strip()]
    counts = [c.get("execution_count") for c in code]
    assert counts == list(range(1, len(code) + 1)), "re-execute the notebook top to bottom in a fresh kernel"
    for number, cell in enumerate(code):
        for output in cell.get("outputs", []):
            assert output.get("name") != "stderr" and output["output_type"] != "error", \
                f"code cell {number} stored stderr or an error: {str(output)[:300]}"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_teaching_cells_are_short(path):
    long_cells = [(n, len(source(c).splitlines())) for n, c in enumerate(cells(path, "code"))
                  if len(source(c).splitlines()) > MAX_CELL_LINES]
    assert not long_cells, f"(cell, lines) over {MAX_CELL_LINES} lines: {long_cells}; core first, helpers out of the way"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_checks_raise_rather_than_print_a_boolean(path):
    """A learner who breaks the code must be stopped: assert (or assert_close) first, then print."""
    printed_checks = re.compile(r"print\([^\n]*(torch\.allclose|torch\.equal)\(")
    for number, cell in enumerate(cells(path, "code")):
        match = printed_checks.search(source(cell))
        assert match is None, f"cell {number} prints a check instead of asserting it: {match.group(0)!r}"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_cross_references_are_links_that_resolve(path):
    for number, cell in enumerate(cells(path, "markdown")):
        text = source(cell)
        for _, target in MARKDOWN_LINK.findall(text):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            file_part = target.split("#")[0]
            assert (path.parent / file_part).resolve().exists(), f"markdown cell {number}: broken link {target}"
        unlinked = re.search(r"\bnotebooks? \d\d\b", MARKDOWN_LINK.sub("", text))
        assert unlinked is None, (f"markdown cell {number}: {unlinked.group(0)!r} is not a link; write "
                                  f"[notebook 03](03_positional_encoding.ipynb)")


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name[:2] != "00"],
                         ids=ids([p for p in NOTEBOOKS if p.name[:2] != "00"]))
def test_exercises_have_checkers_and_solutions(path):
    markdown = "\n".join(source(c) for c in cells(path, "markdown"))
    assert "## Exercises" in markdown, "an '## Exercises' section"
    exercises = markdown.split("## Exercises", 1)[1]
    assert len(re.findall(r"^\s*\d+\.\s", exercises, flags=re.M)) >= 3, "at least three numbered exercises"
    outside_the_wheel = re.search(r"\b(tests|scripts|results)/", exercises)
    assert outside_the_wheel is None, (f"an exercise sends the learner to {outside_the_wheel.group(0)}, which pip "
                                       "does not install (Colab has no checkout)")
    checks = set(re.findall(r"\b(check_\w+)\(", "\n".join(source(c) for c in cells(path, "code"))))
    assert len(checks) >= 2, "at least two coding exercises, each with a check_…(your_function) call"
    solution = ROOT / "solutions" / path.name
    assert solution.is_file(), f"solutions/{path.name} is missing"
    solved = "\n".join(source(c) for c in cells(solution, "code"))
    for check in checks:
        assert f"{check}(" in solved, f"solutions/{path.name} never runs {check}"
    for cell in cells(solution, "code"):
        for output in cell.get("outputs", []):
            assert "not attempted yet" not in "".join(output.get("text", "")), \
                f"solutions/{path.name} has an unsolved exercise"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name[:2] != "00"],
                         ids=ids([p for p in NOTEBOOKS if p.name[:2] != "00"]))
def test_exercises_link_their_solutions(path):
    markdown = "\n".join(source(c) for c in cells(path, "markdown"))
    exercises = markdown.split("## Exercises", 1)[-1]
    assert f"(../solutions/{path.name})" in exercises, \
        f"the exercises of {path.name} must link their solutions: [solutions/{path.name}](../solutions/{path.name})"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_folded_cells_are_folded_everywhere_and_explained(path):
    """Hardening is folded, not deleted: a cell folded in Jupyter (`jupyter.source_hidden`) is also
    folded on the site (the `hide-input` tag) and the other way round, and a markdown sentence right
    above it says what it guards. The core idea itself is never folded: no folded cell is a check."""
    found = cells(path)
    for number, cell in enumerate(found):
        if cell["cell_type"] != "code":
            continue
        hidden = cell.get("metadata", {}).get("jupyter", {}).get("source_hidden", False)
        tagged = "hide-input" in cell.get("metadata", {}).get("tags", [])
        assert hidden == tagged, (f"cell {number}: folded in Jupyter ({hidden}) but not on the site ({tagged}) "
                                  "or the other way round; set both")
        if hidden:
            above = found[number - 1]
            assert above["cell_type"] == "markdown" and source(above).strip(), \
                f"cell {number} is folded: put one sentence above it that says what it guards"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_validation_cells_are_folded(path):
    """An exported cell that only defines input checks (every function in it is a `_check_…`) is
    hardening, not the idea: it must be folded, so the learner reads the component first."""
    for number, cell in enumerate(cells(path, "code")):
        text = source(cell)
        if not text.startswith("#| export"):
            continue
        defined = re.findall(r"^(?:def|class) (\w+)", text, re.M)
        if defined and all(name.startswith("_check") for name in defined):
            assert cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"), \
                f"code cell {number} only defines checks ({', '.join(defined)}): fold it (jupyter.source_hidden " \
                "and the hide-input tag) under one sentence saying what it guards"


def read_minutes(path: Path) -> int:
    """Notebook 00's rule for the Read column: 150 words of prose and 10 non-blank code lines a minute,
    rounded to 5 minutes."""
    words = sum(len(source(c).split()) for c in cells(path, "markdown"))
    lines = sum(1 for c in cells(path, "code") for line in source(c).splitlines() if line.strip())
    return 5 * round((words / 150 + lines / 10) / 5)


def test_syllabus_read_times_follow_their_stated_rule():
    """The syllabus of notebook 00 says how its Read column is computed and that notebooks may drift
    from it by a fifth (or 10 minutes) before the table must be redone."""
    table = source(cells(NOTEBOOKS[0], "markdown")[[i for i, c in enumerate(cells(NOTEBOOKS[0], "markdown"))
                                                     if "## 3. Syllabus" in source(c)][0]])
    rows = re.findall(r"^\| \[?(\d\d) ·.*\| (\d+) min \|$", table, re.M)
    assert [number for number, _ in rows] == [p.name[:2] for p in NOTEBOOKS], "one row per notebook, in order"
    for (number, minutes), path in zip(rows, NOTEBOOKS):
        rule = read_minutes(path)
        assert abs(int(minutes) - rule) <= max(10, rule / 5), \
            f"notebook {number}: the syllabus says {minutes} min to read, its rule gives {rule} min; update the table"
