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
  consecutive printed outputs are joined (as Jupyter shows them), and a table printed as text too
  wide for a phone's output box (docs/printed_tables.py) is shown as an HTML table, which course.js
  turns into cards of "header: value" on a narrow screen; its text stays the output's text/plain;
- the Markdown pages (`DOC_PAGES`) are copied with the same link rewriting, and listed after the
  solutions;
- `images/` is copied so README's `images/x.png` and notebooks' figures resolve.

Usage: python docs/stage_site.py [STAGING_DIR]
"""

import json
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from printed_tables import split_text_tables, table_html  # noqa: E402

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
