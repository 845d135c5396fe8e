"""Stage the course website's sources: README as the front page, the notebooks, the solutions,
and the Markdown pages the README links to (results, command line, maintainer's guide).

Sphinx reads the staged folder (`build/site_src/` by default), never the repository itself, so
the site can rewrite what only makes sense on GitHub without touching the committed files:

- README.md becomes `index.md`, with a table of contents for the notebooks appended, and links
  to README.md from a notebook go to that front page;
- notebooks and solutions are copied with their stored outputs (no re-execution), except that
  relative links to repository files that are not pages of the site (scripts, results, ...)
  become links to those files on GitHub, so every internal link of the site resolves; nbdev's
  directive lines (`#| default_exp ...`, `#| export`) are dropped, since they mean nothing to
  a reader (a cell that held only directives goes); and a cell folded in Jupyter
  (`jupyter.source_hidden`) gets the `hide-input` tag, which myst-nb shows as a "show code" toggle;
  a table printed as aligned text too wide for a phone's output box (a header line over rows whose
  columns are two or more spaces apart, `text_tables`) is shown as an HTML table, which course.js
  turns into cards of "header: value" on a narrow screen; its text stays the output's text/plain;
- the Markdown pages (`DOC_PAGES`) are copied with the same link rewriting, and listed after the
  solutions;
- `images/` is copied so README's `images/x.png` and notebooks' figures resolve.

Usage: python docs/stage_site.py [STAGING_DIR]
"""

import html
import json
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIRS = ("notebooks", "solutions")
# Markdown pages of the site besides the front page, in the order of its sidebar.
DOC_PAGES = ("docs/results.md", "docs/command_line.md", "CONTRIBUTING.md")
# A Markdown link or image target: `](target)` or `](target "title")`.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?((?:\s+\"[^\"]*\")?\s*)\)")


def repository_url() -> str:
    """The course's GitHub URL, from its one home: pyproject.toml `[project.urls] Repository`."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Repository"].rstrip("/")


def site_pages() -> list[str]:
    """Repository-relative paths of the files that become pages besides the front page: the
    notebooks and solutions in reading order, then the Markdown pages."""
    notebooks = [
        p.relative_to(ROOT).as_posix()
        for folder in NOTEBOOK_DIRS
        for p in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb"))
    ]
    return notebooks + [page for page in DOC_PAGES if (ROOT / page).is_file()]


def rewrite_links(markdown: str, source: str, pages: set[str], repo: str) -> str:
    """Point links to repository files that are not site pages or images at GitHub.

    `source` is the repository-relative path of the file the Markdown comes from. Links to
    pages, images, anchors and other sites are left alone; a link to a path that does not
    exist is left alone too, so the Sphinx build and the site test report it.
    """

    def fix(match: re.Match) -> str:
        target, title = match.group(1), match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = (ROOT / Path(source).parent / path).resolve()
        try:
            rel = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            return match.group(0)
        if rel in pages or rel.startswith("images/") or not resolved.exists():
            return match.group(0)
        if rel == "README.md":  # the site's front page
            front = os.path.relpath("index.md", Path(source).parent)
            return f"]({Path(front).as_posix()}{'#' + anchor if anchor else ''}{title})"
        kind = "tree" if resolved.is_dir() else "blob"
        url = f"{repo}/{kind}/main/{rel}" + (f"#{anchor}" if anchor else "")
        return f"]({url}{title})"

    return LINK.sub(fix, markdown)


# nbdev reads its directives from the comment lines at the top of a code cell.
DIRECTIVE = re.compile(r"^[ \t]*#\|.*(?:\n|$)")


def strip_directives(source: str) -> str:
    """`source` without the nbdev directive lines at its top (`#| export`, `#| default_exp x`)."""
    while (match := DIRECTIVE.match(source)):
        source = source[match.end():]
    return source


def site_cells(cells: list[dict], page: str, pages: set[str], repo: str) -> list[dict]:
    """The cells of a notebook as the site shows them (see the module docstring)."""
    shown = []
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            cell["source"] = rewrite_links(text, page, pages, repo)
        elif cell["cell_type"] == "code":
            code = strip_directives(text)
            if code != text and not code.strip() and not cell.get("outputs"):
                continue
            cell["source"] = code
            cell["outputs"] = site_outputs(cell.get("outputs", []))
            metadata = cell.setdefault("metadata", {})
            if metadata.get("jupyter", {}).get("source_hidden"):
                tags = metadata.setdefault("tags", [])
                if "hide-input" not in tags:
                    tags.append("hide-input")
        shown.append(cell)
    return shown


# ---- Printed tables -----------------------------------------------------------------------------

# A phone's output box shows about 43 characters of a line; a narrower text table reads fine as text.
TEXT_TABLE_MIN_CHARS = 44
NUMBER = re.compile(r"[-+]?(?:\d[\d,]*)?\.?\d+[%MkK]?")


def column_spans(rows: list[str]) -> list[tuple[int, int]]:
    """The columns [start, end) of `rows`: what is written in some row, split where every row leaves
    two or more characters blank (one blank separates the words of a cell)."""
    width = max(map(len, rows))
    written = [i for i in range(width) if any(i < len(row) and not row[i].isspace() for row in rows)]
    spans = []
    for i in written:
        if spans and i - spans[-1][1] < 2:
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))
    return spans


def header_cells(header: str, spans: list[tuple[int, int]]) -> list[str]:
    """Each word of the header line names the column it overlaps most; a word over no column names
    the next one to its right (`BLEU:` left of `seed_0`), or the last one."""
    names = [[] for _ in spans]
    for word in re.finditer(r"\S+", header):
        overlap = [min(end, word.end()) - max(start, word.start()) for start, end in spans]
        column = max(range(len(spans)), key=overlap.__getitem__)
        if overlap[column] <= 0:
            column = next((k for k, (start, _) in enumerate(spans) if start >= word.end()), len(spans) - 1)
        names[column].append(word.group())
    return [" ".join(words) for words in names]


def skeleton(cell: str) -> str:
    return NUMBER.sub("0", cell)


def text_table(lines: list[str]) -> tuple[list[str], list[list[str]], int] | None:
    """(header, rows, lines used) when `lines` starts with a text table, else None: a header line
    naming every column, then at least two rows of at least three columns, no cell of which holds a
    run of blanks (that would be two cells) or only punctuation (a printed tensor's brackets)."""
    for end in range(len(lines), 2, -1):                     # the longest table wins
        rows = lines[1:end]
        if max(map(len, lines[:end])) < TEXT_TABLE_MIN_CHARS:
            return None
        spans = column_spans(rows)
        if len(spans) < 3:
            continue
        header = header_cells(lines[0], spans)
        cells = [[row[start:end_].strip() for start, end_ in spans] for row in rows]
        if not all(re.search(r"[^\W\d_]", name) for name in header):
            continue
        if any("  " in c or (c and not re.search(r"\w", c)) for row in cells for c in row):
            continue
        if any(sum(map(bool, row)) < 2 for row in cells):
            continue
        # A first line shaped like the rows is a row, not a header (`train: 20000 pairs, ...`).
        if sum(skeleton(h) == skeleton(c) for h, c in zip(header, cells[0])) * 2 >= len(spans):
            continue
        return header, cells, end
    return None


def table_html(header: list[str], rows: list[list[str]]) -> str:
    numeric = [all(NUMBER.fullmatch(row[k]) for row in rows if row[k]) for k in range(len(header))]
    align = [' class="course-number"' if n else "" for n in numeric]  # right-aligned in a table
    cell = lambda tag, text, k: f"<{tag}{align[k]}>{html.escape(text)}</{tag}>"  # noqa: E731
    head = "".join(cell("th", name, k) for k, name in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", text, k) for k, text in enumerate(row)) + "</tr>\n" for row in rows)
    return f'<table class="table course-text-table">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n'


def split_text_tables(text: str) -> list[str | tuple[list[str], list[list[str]], str]]:
    """`text` as pieces: plain text, and (header, rows, its text) for each wide text table in it.
    A table starts a paragraph (the text's start or a line after a blank one)."""
    lines, pieces, plain, i = text.splitlines(keepends=True), [], [], 0
    while i < len(lines):
        paragraph = lines[i:next((j for j in range(i, len(lines)) if not lines[j].strip()), len(lines))]
        starts = i == 0 or not lines[i - 1].strip()
        table = text_table([line.rstrip("\n") for line in paragraph]) if starts else None
        if table is None:
            plain.append(lines[i])
            i += 1
            continue
        header, rows, used = table
        pieces += ["".join(plain)] if "".join(plain).strip() else []
        pieces.append((header, rows, "".join(lines[i:i + used])))
        plain, i = [], i + used
    return pieces + (["".join(plain)] if "".join(plain).strip() else [])


def site_outputs(outputs: list[dict]) -> list[dict]:
    """The outputs of a code cell as the site shows them: consecutive printed outputs joined (as
    Jupyter shows them), and each wide text table in them an HTML table with its text beside it."""
    merged = []
    for out in outputs:
        last = merged[-1] if merged else {}
        if out.get("output_type") == last.get("output_type") == "stream" and out["name"] == last["name"]:
            merged[-1] = dict(last, text="".join(last["text"]) + "".join(out["text"]))
        else:
            merged.append(out)
    shown = []
    for out in merged:
        pieces = split_text_tables("".join(out["text"])) if out.get("output_type") == "stream" and out["name"] == "stdout" else []
        if not any(isinstance(piece, tuple) for piece in pieces):
            shown.append(out)
            continue
        for piece in pieces:
            if isinstance(piece, str):   # blank lines next to a table: the table's margin stands for them
                shown.append(dict(out, text=piece.strip("\n") + "\n"))
            else:
                header, rows, text = piece
                shown.append({"output_type": "display_data", "metadata": {},
                              "data": {"text/html": table_html(header, rows), "text/plain": text}})
    return shown


def toctree(caption: str, docs: list[str]) -> str:
    entries = "\n".join(str(Path(d).with_suffix("")) for d in docs)
    return f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n{entries}\n```\n"


def stage(dest: Path) -> None:
    repo = repository_url()
    pages = site_pages()
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "images", dest / "images")

    for page in pages:
        (dest / page).parent.mkdir(parents=True, exist_ok=True)
        if page.endswith(".md"):
            text = rewrite_links((ROOT / page).read_text(encoding="utf-8"), page, set(pages), repo)
            (dest / page).write_text(text, encoding="utf-8")
            continue
        nb = json.loads((ROOT / page).read_text(encoding="utf-8"))
        nb["cells"] = site_cells(nb["cells"], page, set(pages), repo)
        (dest / page).write_text(json.dumps(nb, ensure_ascii=False, indent=1), encoding="utf-8")

    readme = rewrite_links((ROOT / "README.md").read_text(encoding="utf-8"), "README.md", set(pages), repo)
    readme += toctree("Notebooks", [p for p in pages if p.startswith("notebooks/")])
    solutions = [p for p in pages if p.startswith("solutions/")]
    if solutions:
        readme += toctree("Solutions to the exercises", solutions)
    docs = [p for p in pages if p.endswith(".md")]
    if docs:
        readme += toctree("Results and reference", docs)
    (dest / "index.md").write_text(readme, encoding="utf-8")
    print(f"staged README + {len(pages) - len(docs)} notebooks + {len(docs)} pages into {dest}")


if __name__ == "__main__":
    stage(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "site_src")
