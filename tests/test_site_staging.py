"""How docs/stage_site.py prepares the course website's sources (no browser; tests/test_site.py
checks the built pages in Chromium): links to repository files that are not pages point at GitHub,
nbdev's directive lines are dropped, a cell folded in Jupyter gets the `hide-input` tag, and a
printed table wider than a phone's output box becomes an HTML table with its text beside it."""

import sys
from pathlib import Path

import pytest

# The site is built with Python 3.11 or later (Sphinx 9; stage_site.py reads pyproject.toml with tomllib),
# so on the unit matrix's Python 3.10 there is nothing to test here.
pytest.importorskip("tomllib", reason="the website's staging needs Python >= 3.11, as Sphinx 9 does")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
from printed_tables import split_text_tables, table_html  # noqa: E402
from stage_site import repository_url, rewrite_links, site_cells, site_outputs, site_pages, strip_directives  # noqa: E402


def code_cell(source, outputs=(), **metadata) -> dict:
    return {"cell_type": "code", "id": f"c{abs(hash(source))}", "execution_count": 1, "metadata": metadata, "source": source,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": text} for text in outputs]}


@pytest.mark.parametrize("source, link, expected", [
    ("README.md", "[n](notebooks/04_attention.ipynb)", "[n](notebooks/04_attention.ipynb)"),
    ("README.md", "![a](images/architecture.png)", "![a](images/architecture.png)"),
    ("README.md", "[s](scripts/test.sh)", "[s]({repo}/blob/main/scripts/test.sh)"),
    ("README.md", "[r](results/multi30k/)", "[r]({repo}/tree/main/results/multi30k)"),
    ("README.md", "[h](#syllabus)", "[h](#syllabus)"),
    ("README.md", "[w](https://arxiv.org/abs/1706.03762)", "[w](https://arxiv.org/abs/1706.03762)"),
    ("notebooks/05_multihead_attention.ipynb", "[n](04_attention.ipynb#masks)", "[n](04_attention.ipynb#masks)"),
    ("notebooks/05_multihead_attention.ipynb", "[c](../transformer_lib/attention.py)",
     "[c]({repo}/blob/main/transformer_lib/attention.py)"),
    ("notebooks/05_multihead_attention.ipynb", "[m](../README.md#syllabus)", "[m](../index.md#syllabus)"),
    ("notebooks/05_multihead_attention.ipynb", "[x](no_such_file.ipynb)", "[x](no_such_file.ipynb)"),
])
def test_staging_points_links_to_non_pages_at_github(source, link, expected):
    pages = set(site_pages()) | {"notebooks/04_attention.ipynb"}
    repo = repository_url()
    assert rewrite_links(link, source, pages, repo) == expected.format(repo=repo)


# Printed by notebook 13 (its Multi30k table, two rows of it) and notebook 09 (with the line after it).
MULTI30K_TABLE = """\
model           test set   decoding BLEU:  seed_0  seed_1   mean   chrF mean
ours            test_2016  greedy            37.6    37.7  37.64        57.4
nn.Transformer  test_2017  beam4             29.1    30.4  29.71        49.7
"""
PARAMETER_TABLE = """\
part                                formula  from the module      formula
embeddings (shared)                     V·D       18,944,000   18,944,000
generator                 0 (tied, no bias)                0            0
total                                             63,082,496   63,082,496
every part matches its formula: True | no parameter left out: True
"""


def test_staging_makes_wide_printed_tables_tables():
    assert split_text_tables("BLEU by seed:\n\n" + MULTI30K_TABLE + "\nthe end\n") == [
        "BLEU by seed:\n\n",
        (["model", "test set", "decoding", "BLEU: seed_0", "seed_1", "mean", "chrF mean"],
         [["ours", "test_2016", "greedy", "37.6", "37.7", "37.64", "57.4"],
          ["nn.Transformer", "test_2017", "beam4", "29.1", "30.4", "29.71", "49.7"]], MULTI30K_TABLE),
        "\nthe end\n"]
    header, rows, text = split_text_tables(PARAMETER_TABLE)[0]
    assert header == ["part", "formula", "from the module", "formula"]
    assert rows[1:] == [["generator", "0 (tied, no bias)", "0", "0"], ["total", "", "63,082,496", "63,082,496"]]
    assert split_text_tables(PARAMETER_TABLE)[1] == "every part matches its formula: True | no parameter left out: True\n"
    html_table = table_html(header, rows)
    assert '<th class="course-number">from the module</th>' in html_table and "<td>0 (tied, no bias)</td>" in html_table
    # Outputs of a cell: the printed pieces joined, the table shown as HTML with its text beside it.
    outputs = site_outputs([{"output_type": "stream", "name": "stdout", "text": PARAMETER_TABLE[:80]},
                            {"output_type": "stream", "name": "stdout", "text": PARAMETER_TABLE[80:]}])
    assert [o["output_type"] for o in outputs] == ["display_data", "stream"]
    assert outputs[0]["data"]["text/plain"] + outputs[1]["text"] == PARAMETER_TABLE
    assert "course-text-table" in outputs[0]["data"]["text/html"]


def test_staging_makes_lines_printed_from_one_template_a_table():
    """Notebook 10's padding table and the solutions' schedule: the words before each varying
    number name its column."""
    padding = ("bucketing by length:\n"
               "max_tokens   128: padding fraction naive 0.260, bucketed 0.015\n"
               "max_tokens  1024: padding fraction naive 0.333, bucketed 0.015\n"
               "max_tokens  4096: padding fraction naive 0.360, bucketed 0.029\n"
               "bucketed wastes less: True\n")
    assert split_text_tables(padding) == [
        "bucketing by length:\n",
        (["max_tokens", "padding fraction naive", "bucketed"],
         [["128", "0.260", "0.015"], ["1024", "0.333", "0.015"], ["4096", "0.360", "0.029"]],
         "".join(padding.splitlines(keepends=True)[1:4])),
        "bucketed wastes less: True\n"]
    schedule = ("step 150 (p = 0.500): eq. 3 3.28e-03, with cooldown 3.28e-03\n"
                "step 263 (p = 0.877): eq. 3 3.82e-03, with cooldown 1.88e-03\n"
                "step 300 (p = 1.000): eq. 3 3.57e-03, with cooldown 0.00e+00\n")
    header, rows, _ = split_text_tables(schedule)[0]
    assert header == ["step", "p", "eq. 3", "with cooldown"] and rows[2] == ["300", "1.000", "3.57e-03", "0.00e+00"]
    # Notebook 04: a number the same on every line is a column where it is given as a value.
    variance = "".join(f"d_k = {d:4}: Var(q.k) / d_k = 1.0, Var(q.k / sqrt(d_k)) = 1.0\n" for d in (1, 4, 16))
    assert split_text_tables(variance) == [(["d_k", "Var(q.k) / d_k", "Var(q.k / sqrt(d_k))"],
                                            [[d, "1.0", "1.0"] for d in ("1", "4", "16")], variance)]


@pytest.mark.parametrize("text", [
    "train:  20000 pairs,  20000 unique English\nvalid:    500 pairs,    500 unique English\n"
    "test :    500 pairs,    500 unique English\n",                     # no header: three alike rows
    "M_1 top-left 4x4 block (rotations by w_0 = 1 and w_1):\n[[ 0.5403  0.8415  0.      0.    ]\n"
    " [-0.8415  0.5403  0.      0.    ]]\n",                              # a printed array
    "d    a    b\n1    2    3\n4    5    6\n",                          # narrow: it reads fine as text
    "source:     the teachers watched a queen and the king\nreference:  la lernoj reginon rigardis\n"
    "hypothesis: la lernoj reginon rigardis\n",                        # labelled lines, not columns
    "k =    1: 4999 positions, max |PE(pos+k) - M_k PE(pos)| < 1e-5: True\n"
    "k =    2: 4998 positions, max |PE(pos+k) - M_k PE(pos)| < 1e-5: True\n"
    "k =    7: 4993 positions, max |PE(pos+k) - M_k PE(pos)| < 1e-5: True\n",  # words after the last number
    "batch 1 of the validation set holds no padding at all in this run\n"
    "batch 2 of the validation set holds no padding at all in this run\n"
    "batch 3 of the validation set holds no padding at all in this run\n",  # one number: a list
    "step 1 loss 3.2\nstep 2 loss 2.9\nstep 3 loss 2.7\n",           # narrow
    " [ 0.8415  0.5403  0.0998  0.995   0.01    1.      0.001   1.    ]\n"
    " [ 0.9093 -0.4161  0.1987  0.9801  0.02    0.9998  0.002   1.    ]\n"
    " [ 0.1411 -0.99    0.2955  0.9553  0.03    0.9996  0.003   1.    ]\n",  # rows of a printed array
])
def test_staging_leaves_printed_text_that_is_no_wide_table(text):
    assert split_text_tables(text) == [text]


def test_staging_drops_directives_and_folds_hidden_cells():
    cells = [
        code_cell("#| default_exp attention"),                                   # only a directive: dropped
        code_cell("#| export\ndef f(x):\n    return x\n"),                      # directive line dropped
        code_cell("if x < 0:\n    raise ValueError\n", ["ok\n"], jupyter={"source_hidden": True}),
        code_cell("print(1)  #| not a directive here", ["1\n"], tags=["hide-input"]),
    ]
    shown = site_cells(cells, "notebooks/04_attention.ipynb", set(), repository_url())
    assert [c["source"] for c in shown] == ["def f(x):\n    return x\n", "if x < 0:\n    raise ValueError\n",
                                            "print(1)  #| not a directive here"]
    assert [c["metadata"].get("tags") for c in shown] == [None, ["hide-input"], ["hide-input"]]
    assert strip_directives("#| export\n#| hide\nx = 1") == "x = 1"
