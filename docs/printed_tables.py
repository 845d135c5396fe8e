"""Tables printed as text, found in a notebook's output so that the course website can show them as
HTML tables (docs/stage_site.py; docs/_static/course.js makes a table too wide for a phone cards).

A phone shows about 43 characters of an output line, so a printed table wider than that hides its
right-hand columns, often the numbers a reader came for. Two kinds are recognised:

- a header line over rows whose columns line up, two or more blanks apart (`text_table`):
      model           test set   decoding BLEU:  seed_0  seed_1   mean   chrF mean
      ours            test_2016  greedy            37.6    37.7  37.64        57.4
- lines printed from one template with different numbers (`template_table`): the words between the
  numbers that vary name the columns
      max_tokens   128: padding fraction naive 0.260, bucketed 0.015
      max_tokens   256: padding fraction naive 0.292, bucketed 0.015

Anything else stays text, and so does a table no wider than a phone's output box.
"""

import html
import re

# A phone's output box shows about 43 characters of a line; a narrower text table reads fine as text.
TEXT_TABLE_MIN_CHARS = 44
# A table with a header line is looked for in the first lines of a paragraph only (the search is
# quadratic in its length; the notebooks print at most a few dozen lines at a time).
TEXT_TABLE_MAX_LINES = 120
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
    for end in range(min(len(lines), TEXT_TABLE_MAX_LINES), 2, -1):   # the longest table wins
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


# A number as a template fills it in: not part of a name (`seed_0`, `p-2`, `w_1`), maybe with
# thousands separators, a fraction, an exponent and a percent sign.
FILLED_NUMBER = re.compile(r"(?<![\w.-])([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?%?)(?![\w.])")


def column_name(label: str) -> str:
    """The words between two numbers as a column's name: `): eq. 3` -> `eq. 3`, `, with cooldown` ->
    `with cooldown`, `(p` -> `p` (a bracket the name does not close or open goes)."""
    while True:
        name = label.strip(" :,;=|")
        if name.startswith(")") or (name.startswith("(") and ")" not in name):
            name = name[1:]
        if name.endswith("(") or (name.endswith(")") and "(" not in name):
            name = name[:-1]
        if name == label:
            return name
        label = name


def template_run(lines: list[str]) -> list[list[str]]:
    """The first lines of `lines` printed from the first one's template, each split into its words
    and its numbers (words, number, words, ..., words)."""
    words = lambda line_parts: [" ".join(t.split()) for t in line_parts[::2]]  # noqa: E731
    parts = [FILLED_NUMBER.split(lines[0])] if lines else []
    for line in lines[1:]:
        line_parts = FILLED_NUMBER.split(line)
        if len(line_parts) != len(parts[0]) or words(line_parts) != words(parts[0]):
            break
        parts.append(line_parts)
    return parts


def template_table(lines: list[str]) -> tuple[list[str], list[list[str]], int] | None:
    """(header, rows, lines used) when `lines` starts with at least three lines printed from one
    template (the same words, numbers that differ) with at least two columns, else None. A column
    is a number that varies, or one the same on every line given as a value (after `=` or `:`); the
    words before it name it, and other numbers the same on every line are words."""
    parts = template_run(lines)
    end = len(parts)
    if end < 3 or max(map(len, lines[:end])) < TEXT_TABLE_MIN_CHARS:
        return None
    varying = [k for k in range(1, len(parts[0]), 2) if len({p[k] for p in parts[:end]}) > 1]
    # A number the same on every line is a column too where it is given as a value (`= 1.0`).
    columns = [k for k in range(1, len(parts[0]), 2)
               if k in varying or (varying and parts[0][k - 1].rstrip().endswith(("=", ":")))]
    header, label = [], ""
    for k, text in enumerate(parts[0]):
        if k in columns:
            header.append(column_name(label))
            label = ""
        else:
            label += text
    if len(columns) < 2 or label.strip() or not all(re.search(r"[^\W\d_]", name) for name in header):
        return None       # text after the last number would belong to no column
    return header, [[p[k] for k in columns] for p in parts[:end]], end


def table_html(header: list[str], rows: list[list[str]]) -> str:
    numeric = [all(NUMBER.fullmatch(row[k]) for row in rows if row[k]) for k in range(len(header))]
    align = [' class="course-number"' if n else "" for n in numeric]  # right-aligned in a table
    cell = lambda tag, text, k: f"<{tag}{align[k]}>{html.escape(text)}</{tag}>"  # noqa: E731
    head = "".join(cell("th", name, k) for k, name in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", text, k) for k, text in enumerate(row)) + "</tr>\n" for row in rows)
    return f'<table class="table course-text-table">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n'


def split_text_tables(text: str) -> list[str | tuple[list[str], list[list[str]], str]]:
    """`text` as pieces: plain text, and (header, rows, its text) for each wide text table in it.
    A table with a header line starts a paragraph (the text's start or a line after a blank one)."""
    lines, pieces, plain, i = text.splitlines(keepends=True), [], [], 0
    while i < len(lines):
        paragraph = [line.rstrip("\n") for line in lines[i:next(
            (j for j in range(i, len(lines)) if not lines[j].strip()), len(lines))]]
        starts = i == 0 or not lines[i - 1].strip()
        table = (text_table(paragraph) if starts else None) or template_table(paragraph)
        if table is None:   # the lines printed from this one's template are no table either
            skip = max(1, len(template_run(paragraph)))
            plain += lines[i:i + skip]
            i += skip
            continue
        header, rows, used = table
        pieces += ["".join(plain)] if "".join(plain).strip() else []
        pieces.append((header, rows, "".join(lines[i:i + used])))
        plain, i = [], i + used
    return pieces + (["".join(plain)] if "".join(plain).strip() else [])
