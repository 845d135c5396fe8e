"""`translate --attention`: the command line draws the cross-attention of every sentence it
translates, into one PNG or a folder of them, with greedy decoding and beam search; a bad
--attention* value is one `error:` line naming the option, exit code 2, with nothing written.
Run in-process through `main([...])` on one tiny run trained once for the module."""
import io
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from PIL import Image

# Two decoder layers of two heads, trained for two steps: enough for the options to have a range.
TINY = ["--data", "builtin", "--vocab-size", "200", "--d-model", "16", "--heads", "2", "--d-ff", "32",
        "--layers", "2", "--max-len", "24", "--max-tokens", "512", "--max-steps", "2", "--checkpoint-every", "2",
        "--threads", "1", "--device", "cpu", "--no-progress", "--seed", "0"]
SENTENCES = ["a queen waited", "the old dog chased a cat near the river"]


def cli(*args, stdin: str = "") -> subprocess.CompletedProcess:
    """`python -m transformer_lib ARGS` run as `main(argv)` in this process: exit code, stdout, stderr."""
    from transformer_lib.cli import main
    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8")
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8"), stdout, err
    try:
        code = main([str(a) for a in args])
    except SystemExit as exit:                  # argparse's answer to a bad argument
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:
        traceback.print_exc(file=err)
        code = 1
    finally:
        stdout.flush()
        sys.stdin, sys.stdout, sys.stderr = saved
    written = out.getvalue().decode("utf-8")
    stdout.detach()
    return subprocess.CompletedProcess(args, code, written, err.getvalue())


def assert_refused(result, *words: str) -> None:
    """Exit code 2 and one `error:` line on stderr holding every word."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def png_size_and_text(path: Path) -> tuple[int, int, float, dict]:
    """Width, height, dpi and tEXt entries of a PNG file."""
    with Image.open(path) as image:
        assert image.format == "PNG"
        return *image.size, image.info.get("dpi", (72.0, 72.0))[0], dict(image.text)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("attention") / "run"
    result = cli("train", "--run", run, *TINY)
    assert result.returncode == 0, result.stderr
    return run


@pytest.mark.parametrize("beam", ["1", "3"])
def test_one_sentence_one_png(run, tmp_path, beam):
    plain = cli("translate", "--run", run, "--beam", beam, SENTENCES[1])
    result = cli("translate", "--run", run, "--beam", beam, "--attention", tmp_path / "map.png", SENTENCES[1])
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout == plain.stdout, "drawing the map changed the translation"
    width, height, dpi, text = png_size_and_text(tmp_path / "map.png")
    # The smallest text of the figure, in pixels at the PNG's own size: 12 pt at 100 dpi.
    assert float(text["Smallest font (pt)"]) * dpi / 72 >= 10
    assert width >= 500 and height >= 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.png"]


def test_folder_gets_one_png_per_sentence_numbered_by_input_line(run, tmp_path):
    stdin = f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n"
    result = cli("translate", "--run", run, "--attention", tmp_path / "maps", "--attention-layer", "1",
                 "--attention-head", "2", stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert result.stdout == cli("translate", "--run", run, stdin=stdin).stdout
    assert result.stdout.split("\n")[1] == "", "a blank line stays blank"
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["001.png", "003.png"]
    longer, shorter = png_size_and_text(tmp_path / "maps" / "003.png"), png_size_and_text(tmp_path / "maps" / "001.png")
    assert longer[0] > shorter[0], "the figure grows with the source sentence"


@pytest.mark.parametrize("options, words", [
    (["--attention-layer", "3"], ["--attention-layer 3", "2 decoder layers", "1 to 2"]),
    (["--attention-head", "3"], ["--attention-head 3", "2 heads", "1 to 2 or mean"]),
    (["--attention-head", "max"], ["--attention-head", "a head number from 1, or mean"]),
    (["--attention-layer", "0"], ["--attention-layer", "positive integer"]),
    (["--compile"], ["--attention", "--compile"])])
def test_bad_attention_options_write_nothing(run, tmp_path, options, words):
    assert_refused(cli("translate", "--run", run, "--attention", tmp_path / "map.png", *options, SENTENCES[0]),
                   *words)
    assert list(tmp_path.iterdir()) == []


def test_layer_or_head_without_attention_is_refused(run):
    assert_refused(cli("translate", "--run", run, "--attention-head", "1", SENTENCES[0]),
                   "--attention-head", "add --attention")


def test_one_png_for_two_sentences_is_refused(run, tmp_path):
    assert_refused(cli("translate", "--run", run, "--attention", tmp_path / "map.png", *SENTENCES),
                   "--attention", "2 sentences", "give a folder")
    assert list(tmp_path.iterdir()) == []


def test_attention_path_in_the_way_is_refused(run, tmp_path):
    (tmp_path / "maps").write_text("a file")
    assert_refused(cli("translate", "--run", run, "--attention", tmp_path / "maps", SENTENCES[0]),
                   "--attention", "is a file, not a folder")
    (tmp_path / "map.png").mkdir()
    assert_refused(cli("translate", "--run", run, "--attention", tmp_path / "map.png", SENTENCES[0]),
                   "--attention", "is a folder, not a file")
