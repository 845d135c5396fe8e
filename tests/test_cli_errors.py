"""Tests for the command line (transformer_lib/cli.py) on bad input: every problem is one `error:`
line and exit code 2 (never a traceback), and a refused `train` leaves the run folder as it was,
byte for byte. Each case runs the command line's `main(argv)` in this process (stdin, stdout and
stderr its own, exit code returned), which saves a second of imports per case; the tests that are
about the process itself (raw bytes in argv, the `python -m transformer_lib` entry) start one. They
share one tiny trained run, copied per test."""
import io
import json
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

from transformer_lib.tokenization import SubwordTokenizer, train_bpe_tokenizer

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
MAX_LEN = 40      # above the builtin corpus's longest pair (33 tokens at this vocabulary): none is dropped
# A model small enough to train in a second; max_len is small so that long inputs are cheap to make.
TINY = ["--data", "builtin", "--vocab-size", "200", "--d-model", "16", "--heads", "2", "--d-ff", "32",
        "--layers", "1", "--max-len", str(MAX_LEN), "--max-tokens", "512", "--max-steps", "2",
        "--checkpoint-every", "1", "--threads", "1", "--device", "cpu", "--no-progress", "--seed", "0"]


def cli(*args, stdin: str | bytes | None = "") -> subprocess.CompletedProcess:
    """`python -m transformer_lib ARGS`, run as `main(argv)` in this process: its exit code, stdout
    and stderr as a process would give them (an uncaught exception is printed as a traceback).
    stdin=None: started with stdin closed (`<&-`), where Python's sys.stdin is None."""
    from transformer_lib.cli import main
    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8")
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = None if stdin is None else io.TextIOWrapper(
        io.BytesIO(stdin.encode() if isinstance(stdin, str) else stdin), encoding="utf-8")
    sys.stdout, sys.stderr = stdout, err
    try:
        code = main([str(a) for a in args])
    except SystemExit as exit:                  # argparse's answer to a bad argument
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:                       # what a process would print before dying
        traceback.print_exc(file=err)
        code = 1
    finally:
        stdout.flush()
        sys.stdin, sys.stdout, sys.stderr = saved
    written = out.getvalue().decode("utf-8")
    stdout.detach()                             # so that closing the wrapper leaves `out` alone
    return subprocess.CompletedProcess(args, code, written, err.getvalue())


def train(run: Path, *extra) -> subprocess.CompletedProcess:
    """`train` with the TINY settings; later options win over earlier ones."""
    return cli("train", "--run", run, *TINY, *extra)


def assert_refused(result: subprocess.CompletedProcess, *words: str) -> str:
    """Exit code 2 and stderr exactly one `error:` line that contains every word; returns the line."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0], result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def last_line(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """`result` with only the last line of its stderr: the error after what `train` said before its first step."""
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout,
                                       result.stderr.strip().splitlines()[-1] + "\n")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of a folder and its bytes: equal snapshots mean nothing was written."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("cli_errors") / "run"
    result = train(run)
    assert result.returncode == 0, result.stderr
    return run


@pytest.fixture
def run(trained_run, tmp_path) -> Path:
    """A private copy of the trained run, free to damage."""
    return Path(shutil.copytree(trained_run, tmp_path / "run"))


def sentence_of(run: Path, n_tokens: int) -> str:
    """A source sentence of exactly `n_tokens` tokens (with <s> and </s>) for the run's tokenizer."""
    tokenizer = SubwordTokenizer.load(run / "tokenizer.json")
    words = ["a"]
    while len(tokenizer.encode(" ".join(words))) < n_tokens:
        words.append("a")
    assert len(tokenizer.encode(" ".join(words))) == n_tokens
    return " ".join(words)


# --- train checks every argument before it writes anything -------------------------------------------

@pytest.mark.parametrize("option, value, words", [
    ("--max-steps", "-1", ["--max-steps", "-1"]),
    ("--threads", "0", ["--threads", "[1, 1024]"]),
    ("--threads", "-2", ["--threads", "[1, 1024]"]),
    ("--lr-factor", "-1", ["--lr-factor", "> 0"]),
    ("--lr-factor", "0", ["--lr-factor", "> 0"]),
    ("--lr-factor", "nan", ["--lr-factor", "finite"]),
    ("--lr-factor", "inf", ["--lr-factor", "finite"]),
    ("--device", "gpu", ["unknown device", "gpu"]),
    ("--dropout", "1.5", ["--dropout", "[0, 1)"]),
    ("--time-budget", "0s", ["--time-budget", "duration"]),
    ("--max-len", "1", ["--max-len"]),
    ("--accumulate", "0", ["--accumulate", "positive"]),
    ("--accumulate", "1.5", ["--accumulate", "positive integer"]),
    ("--attention-dropout", "1", ["--attention-dropout", "[0, 1)"]),
    ("--activation-dropout", "-0.1", ["--activation-dropout", "[0, 1)"]),
    ("--cooldown", "1", ["--cooldown", "[0, 1)"]),
    ("--validate-every", "-10", ["--validate-every", ">= 0"]),
])
def test_train_bad_argument_writes_nothing(tmp_path, option, value, words):
    run = tmp_path / "run"
    assert_refused(train(run, option, value), *words)
    assert not run.exists()


@pytest.mark.parametrize("extra, words", [
    (["--d-model", "30", "--heads", "4"], ["d_model", "n_heads"]),          # the model's own check
    (["--vocab-size", "5"], ["vocab_size=5", "too small"]),                  # the tokenizer's own check
    (["--max-len", "3"], ["length filter removed", "--max-len"]),           # no pair fits
    (["--amp", "fp16"], ["--amp fp16", "CUDA"]),
    (["--max-tokens", "100000", "--accumulate", "64"], ["batches, fewer than the 64", "--accumulate"]),
    (["--validate-every", "15"], ["--validate-every", "multiple of 10"]),
    (["--max-tokens", "1"], ["--max-tokens 1: example 0 has", "raise max_tokens"]),
])
def test_train_rejected_by_the_library_writes_nothing(tmp_path, extra, words):
    run = tmp_path / "run"
    assert_refused(train(run, *extra), *words)
    assert not run.exists()


def test_failed_train_leaves_no_tokenizer_for_the_next(tmp_path):
    """The issue's sequence: a refused train used to leave a 100-token tokenizer that a later
    `--vocab-size 400` silently reused."""
    run = tmp_path / "run"
    assert_refused(train(run, "--vocab-size", "100", "--max-steps", "-1"), "--max-steps")
    assert not run.exists()
    assert train(run, "--vocab-size", "400", "--max-steps", "1").returncode == 0
    assert SubwordTokenizer.load(run / "tokenizer.json").vocab_size > 100
    assert json.loads((run / "config.json").read_text())["vocab_size"] == 400


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["train", "translate"])
def test_cuda_without_cuda(tmp_path, trained_run, command):
    run = tmp_path / "run"
    if command == "train":
        result = train(run, "--device", "cuda")
        assert not run.exists()
    else:
        result = cli("translate", "--run", trained_run, "--device", "cuda", "a queen waited")
    assert_refused(result, "--device cuda", "no CUDA")


@pytest.mark.parametrize("beam", ["0", "-1"])
def test_translate_bad_beam(trained_run, beam):
    assert_refused(cli("translate", "--run", trained_run, "--beam", beam, "a queen waited"), "--beam", "positive")


@pytest.mark.parametrize("command", ["translate", "evaluate"])
@pytest.mark.parametrize("alpha", ["nan", "inf", "-0.5"])
def test_bad_alpha(trained_run, command, alpha):
    assert_refused(cli(command, "--run", trained_run, "--alpha", alpha), "--alpha", "finite number >= 0")


@pytest.mark.parametrize("alpha", ["0.6,x", "0.6,", "Auto", "0.6,-1"])
def test_bad_alpha_candidates(trained_run, alpha):
    assert_refused(cli("evaluate", "--run", trained_run, "--alpha", alpha), "--alpha", "separated by commas", "auto")


def test_alpha_candidate_out_of_range_is_refused_before_decoding(trained_run):
    assert_refused(cli("evaluate", "--run", trained_run, "--beam", "2", "--alpha", "0.6,11"),
                   "alpha must be a finite number in [-10, 10]")


def test_evaluate_chooses_alpha_on_the_validation_split(trained_run):
    """--alpha with candidates: each decodes the run's validation split (its first --limit pairs), the highest
    BLEU's α decodes the split asked for, and the record says which α and what each scored."""
    chose = cli("evaluate", "--run", trained_run, "--beam", "2", "--alpha", "0,0.6,2", "--limit", "8")
    assert chose.returncode == 0, chose.stderr
    metrics, said = json.loads(chose.stdout), chose.stderr.splitlines()
    assert list(metrics["alpha_valid_bleu"]) == ["0", "0.6", "2"]
    assert metrics["alpha_valid_bleu"][f"{metrics['alpha']:g}"] == max(metrics["alpha_valid_bleu"].values())
    assert said[0].startswith("choosing alpha on valid: beam 2, alpha 0: BLEU ")
    assert said[-1] == f"choosing alpha on valid: alpha {metrics['alpha']:g} scored highest"
    given = json.loads(cli("evaluate", "--run", trained_run, "--beam", "2", "--alpha", str(metrics["alpha"]),
                           "--limit", "8").stdout)
    assert given["bleu"] == metrics["bleu"] and given["alpha"] == metrics["alpha"] and "alpha_valid_bleu" not in given
    greedy = cli("evaluate", "--run", trained_run, "--alpha", "auto", "--limit", "2")   # nothing to choose
    assert greedy.returncode == 0 and greedy.stderr == "" and "alpha" not in json.loads(greedy.stdout)


# --- an existing run: resumed only with its own configuration ---------------------------------------

@pytest.mark.parametrize("extra, words", [
    (["--d-model", "32", "--heads", "4"], ["d_model 16 -> 32 (--d-model)", "n_heads 2 -> 4 (--heads)"]),
    (["--vocab-size", "400"], ["vocab_size 200 -> 400 (--vocab-size)"]),
    (["--post-ln", "--max-len", "64"], ["norm_first True -> False (--post-ln)", f"max_len {MAX_LEN} -> 64"]),
])
def test_train_other_configuration_refused_and_run_unchanged(run, extra, words):
    before = snapshot(run)
    line = assert_refused(train(run, *extra, "--max-steps", "4"), *words, "another configuration")
    assert "d_ff" not in line                       # only the fields that differ are named
    assert snapshot(run) == before


def test_train_other_accumulate_refused_and_run_unchanged(run):
    """Another --accumulate would average other batches per update: refused, with the setting to use."""
    before = snapshot(run)
    assert_refused(train(run, "--max-steps", "4", "--accumulate", "2"),
                   "1 process(es) × --accumulate 1", "this launch has 1 × --accumulate 2", "--accumulate 1")
    assert snapshot(run) == before
    meta = json.loads((run / "config.json").read_text())
    assert (meta["processes"], meta["accumulate"]) == (1, 1)


def test_train_resumes_with_its_own_configuration(run):
    result = train(run, "--max-steps", "3")
    assert result.returncode == 0, result.stderr
    assert "resuming" in result.stderr and json.loads(result.stdout)["steps"] == 3


# --- damaged or mismatched run files ------------------------------------------------------------------

def use(run: Path, command: str) -> subprocess.CompletedProcess:
    """Run `command` on an existing run: translate a sentence, score two, or resume training."""
    if command == "train":
        return train(run, "--max-steps", "4")
    if command == "evaluate":
        return cli("evaluate", "--run", run, "--limit", "2")
    return cli("translate", "--run", run, "a queen waited")


def damage_checkpoint(run: Path, how: str) -> None:
    path = run / "checkpoint.pt"
    path.write_bytes(b"" if how == "empty" else path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("command, how", [("translate", "empty"), ("translate", "truncated"),
                                          ("evaluate", "truncated"), ("train", "truncated")])
def test_damaged_checkpoint(run, command, how):
    damage_checkpoint(run, how)
    before = snapshot(run)
    assert_refused(use(run, command), "checkpoint.pt", "truncated")
    assert snapshot(run) == before


@pytest.mark.parametrize("command", ["translate", "train"])
def test_corrupted_tokenizer(run, command):
    (run / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab"')
    before = snapshot(run)
    assert_refused(use(run, command), "tokenizer.json", "not a readable tokenizer")
    assert snapshot(run) == before


@pytest.mark.parametrize("command", ["translate", "train"])
def test_config_not_json(run, command):
    (run / "config.json").write_text("{'model': oops")
    before = snapshot(run)
    assert_refused(use(run, command), "config.json", "not valid JSON")
    assert snapshot(run) == before


def other_tokenizer(size: int) -> SubwordTokenizer:
    """A tokenizer of exactly `size` tokens trained on other texts: another run's, as far as a run can tell."""
    from transformer_lib.corpus import load_builtin_corpus
    texts = [t for _, t in load_builtin_corpus(n_train=2000, n_valid=1, n_test=1)["train"]]
    tokenizer = train_bpe_tokenizer(texts, vocab_size=size)
    assert tokenizer.vocab_size == size
    return tokenizer


@pytest.mark.parametrize("command", ["translate", "evaluate", "train"])
def test_tokenizer_of_another_run_with_the_same_size(run, command):
    """Only the size and padding id used to be compared: translate exited 0 with nonsense."""
    other_tokenizer(SubwordTokenizer.load(run / "tokenizer.json").vocab_size).save(run / "tokenizer.json")
    before = snapshot(run)
    assert_refused(use(run, command), "tokenizer.json", "not the tokenizer this run was trained with",
                   "another run")
    assert snapshot(run) == before


def make_format_1(run: Path) -> None:
    """Turn a run into one written by the previous version: no format, fingerprints or training settings."""
    meta = json.loads((run / "config.json").read_text())
    for key in ("format", "training", "fingerprints"):
        del meta[key]
    (run / "config.json").write_text(json.dumps(meta, indent=2))


def test_format_1_run_is_read_and_resuming_records_fingerprints(run):
    make_format_1(run)
    result = cli("translate", "--run", run, "a queen waited")
    assert result.returncode == 0, result.stderr
    result = train(run, "--max-steps", "3")
    assert result.returncode == 0, result.stderr
    meta = json.loads((run / "config.json").read_text())
    assert meta["format"] == 3 and meta["training"]["seed"] == 0     # format 3: its checkpoints carry its identity
    assert meta["fingerprints"]["tokenizer"].startswith("sha256:")
    assert meta["fingerprints"]["train_pairs"]["count"] == 20000


def test_format_1_run_with_a_tokenizer_of_another_size(run):
    make_format_1(run)
    train_bpe_tokenizer(["a queen waited", "the king slept"] * 10, vocab_size=40).save(run / "tokenizer.json")
    assert_refused(use(run, "translate"), "tokenizer.json", "config.json", "disagree on the vocabulary")


def test_weights_that_do_not_fit_the_config(run):
    meta = json.loads((run / "config.json").read_text())
    meta["model"]["d_ff"] = 48
    (run / "config.json").write_text(json.dumps(meta))
    assert_refused(use(run, "translate"), "checkpoint.pt", "do not fit", "config.json")


# --- decoding within the model's max_len ----------------------------------------------------------

@pytest.mark.parametrize("n_tokens", [10, MAX_LEN])
def test_translate_source_within_max_len(run, n_tokens):
    """The decoding limit (source + 50 tokens) is capped at max_len instead of failing mid-decode."""
    result = cli("translate", "--run", run, sentence_of(run, n_tokens))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1


def test_translate_source_longer_than_max_len(run):
    assert_refused(cli("translate", "--run", run, sentence_of(run, MAX_LEN + 1)),
                   f"{MAX_LEN + 1} tokens", f"max_len={MAX_LEN}")


def test_translate_no_sentences(trained_run):
    result = cli("translate", "--run", trained_run, stdin="\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_missing_run(tmp_path):
    assert_refused(cli("translate", "--run", tmp_path / "nowhere", "a queen"), "checkpoint.pt", "train first")


def test_argument_checks_accept_edges():
    """The argparse types accept what they should (in-process, no subprocess needed)."""
    from transformer_lib.cli import build_parser
    args = build_parser().parse_args(["train", "--run", "r", "--lr-factor", "1e-3", "--threads", "1",
                                      "--dropout", "0", "--time-budget", "1.5h", "--max-steps", "0"])
    assert (args.lr_factor, args.threads, args.dropout, args.time_budget, args.max_steps) == (1e-3, 1, 0, 5400, 0)
    args = build_parser().parse_args(["translate", "--run", "r", "--alpha", "0", "--device", "cuda:1"])
    assert args.alpha == 0 and args.device == "cuda:1"


# --- the run folder: where it is, who writes it, and what it holds --------------------------------------

def test_train_into_an_empty_path_is_refused(tmp_path):
    """`--run ''` used to train into the current folder."""
    result = subprocess.run([sys.executable, "-m", "transformer_lib", "train", "--run", "", *TINY], cwd=tmp_path,
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert_refused(result, "--run", "empty path")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["train", "translate", "evaluate"])
def test_run_that_is_a_regular_file(tmp_path, command):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    result = train(path) if command == "train" else cli(command, "--run", path, *(["a queen"] * (command == "translate")))
    line = assert_refused(result, "notes.txt is a file")
    assert "train --run" not in line, "never suggest training into a file"
    assert path.read_text() == "mine"


def test_run_under_a_regular_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert_refused(train(tmp_path / "notes.txt" / "run"), "notes.txt is a file, so nothing can be created inside")


def test_train_into_a_folder_of_other_files(tmp_path):
    (tmp_path / "thesis.tex").write_text("mine")
    assert_refused(train(tmp_path), "not a run folder (no config.json)", "thesis.tex")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex"]


# Root writes anywhere, so there a folder is made unwritable for the command by failing the write
# test it makes before any work (tempfile.mkstemp in that folder), in the real `python -m transformer_lib`.
DENY_WRITES_IN = """
import errno, os, runpy, sys, tempfile
denied, real = os.path.realpath(sys.argv.pop(1)), tempfile.mkstemp
def mkstemp(*args, dir=None, **kwargs):
    if dir is not None and os.path.realpath(dir) == denied:
        raise PermissionError(errno.EACCES, "Permission denied")
    return real(*args, dir=dir, **kwargs)
tempfile.mkstemp = mkstemp
runpy.run_module("transformer_lib", run_name="__main__", alter_sys=True)
"""


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_resume_in_a_read_only_folder(run):
    """It used to train until its first checkpoint, then fail, losing those steps."""
    before = snapshot(run)
    if os.geteuid() == 0:
        result = subprocess.run([sys.executable, "-c", DENY_WRITES_IN, str(run), "train", "--run", str(run), *TINY,
                                 "--max-steps", "4"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    else:
        run.chmod(0o555)
        try:
            result = train(run, "--max-steps", "4")
        finally:
            run.chmod(0o755)
    assert_refused(result, f"--run {run}: cannot write in {run} (Permission denied)")
    assert snapshot(run) == before


@pytest.mark.parametrize("option, value", [("--seed", "1"), ("--max-tokens", "256"), ("--label-smoothing", "0")])
def test_resume_with_other_training_settings(run, option, value):
    """A resume with another --seed used to be accepted: its batches and dropout would be another run's."""
    before = snapshot(run)
    assert_refused(train(run, "--max-steps", "4", option, value), f"({option})", "left as it was")
    assert snapshot(run) == before


@pytest.mark.parametrize("max_steps, words", [("2", "it has trained 2 steps (--max-steps)"),
                                              ("1", "it has trained 2 steps, more than --max-steps 1")])
def test_finished_run_says_so_and_changes_nothing(run, max_steps, words):
    before = snapshot(run)
    result = train(run, "--max-steps", max_steps)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == [f"{run} is finished: {words}; nothing was changed "
                                                  "(raise --max-steps or --time-budget to train further)"]
    assert json.loads(result.stdout)["steps"] == 2
    assert snapshot(run) == before


@pytest.mark.parametrize("edit, words", [
    ({"n_heads": 3}, ["config.json", "d_model", "n_heads"]),
    ({"d_model": "32"}, ["config.json", '"model"."d_model" is \'32\'']),
])
def test_hand_edited_config(run, edit, words):
    meta = json.loads((run / "config.json").read_text())
    meta["model"].update(edit)
    (run / "config.json").write_text(json.dumps(meta))
    assert_refused(use(run, "translate"), *words)


def test_random_bytes_as_checkpoint(run):
    (run / "checkpoint.pt").write_bytes(os.urandom(4096))
    line = assert_refused(use(run, "translate"), "checkpoint.pt", "not a checkpoint")
    assert "weights_only" not in line


# --- options that contradict each other, or overflow ---------------------------------------------------

@pytest.mark.parametrize("extra, words", [
    (["--data-dir", "somewhere"], ["--data-dir is for multi30k only"]),
    (["--src-lang", "fr"], ["--src-lang and --tgt-lang are for multi30k and opus_books"]),
    (["--data", "multi30k", "--data-dir", "no/such/folder"], ["--data-dir no/such/folder", "no such folder"]),
    (["--seed", str(2 ** 70)], ["--seed", "[0, 4294967295]"]),
    (["--seed", "-1"], ["--seed", "[0, 4294967295]"]),
    (["--d-model", str(2 ** 70)], ["--d-model", "at most 2147483647"]),
    (["--max-steps", "1e3"], ["--max-steps", "integer"]),
    (["--device", "cuda:99999999999999999999"], ["unknown device"]),
])
def test_train_contradicting_or_overflowing_options(tmp_path, extra, words):
    run = tmp_path / "run"
    assert_refused(train(run, *extra), *words)
    assert not run.exists()


@pytest.mark.parametrize("extra, words", [
    (["--data-dir", "somewhere"], ["--data-dir is for multi30k only"]),
    (["--split", "test_2016"], ["--split test_2016", "builtin", "test"]),
    (["--limit", "0"], ["--limit", "positive"]),
    (["--beam", str(2 ** 40)], ["--beam", "at most"]),
])
def test_evaluate_bad_options(trained_run, extra, words):
    assert_refused(cli("evaluate", "--run", trained_run, *extra), *words)


def test_evaluate_output_checked_before_decoding(trained_run, tmp_path):
    """--output onto a folder used to fail after the whole decode, without naming --output."""
    (tmp_path / "file").write_text("x")
    for output, words in ((tmp_path, "is a folder, not a file"), (tmp_path / "file" / "out.json", "is a file, so")):
        assert_refused(cli("evaluate", "--run", trained_run, "--limit", "2", "--output", output), "--output", words)
    written = tmp_path / "new" / "folder" / "metrics.json"       # missing folders are made
    result = cli("evaluate", "--run", trained_run, "--limit", "2", "--output", written)
    assert result.returncode == 0, result.stderr
    saved = json.loads(written.read_text(encoding="utf-8"))
    assert saved["metrics"] == json.loads(result.stdout) and len(saved["translations"]) == 2
    result = cli("evaluate", "--run", trained_run, "--limit", "1", "--output", written)     # replaced
    assert result.returncode == 0, result.stderr
    assert len(json.loads(written.read_text(encoding="utf-8"))["translations"]) == 1
    assert_refused(cli("evaluate", "--run", trained_run, "--limit", "1", "--output", trained_run / "config.json"),
                   "--output", "would overwrite the config.json of the run")


# --- translate: one line out per line in ------------------------------------------------------------------

def test_translate_keeps_blank_lines_and_line_endings(trained_run):
    """Blank lines used to be dropped, so the output no longer lined up with the input."""
    sentences = ["a queen waited", "the king slept", "some tired horses waited", "a clever queen"]
    alone = cli("translate", "--run", trained_run, *sentences)
    assert alone.returncode == 0, alone.stderr
    expected = alone.stdout.splitlines()
    assert len(expected) == 4 and all(expected)
    stdin = f"{sentences[0]}\n\n   \n{sentences[1]}\r\n{sentences[2]}\r{sentences[3]}\n\n"
    result = cli("translate", "--run", trained_run, stdin=stdin.encode())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n") == [expected[0], "", "", *expected[1:], "", ""]


def test_translate_empty_stdin_gives_nothing(trained_run):
    result = cli("translate", "--run", trained_run, stdin="")
    assert result.returncode == 0 and result.stdout == "", result.stderr


def test_translate_bytes_that_are_not_utf8(trained_run):
    result = cli("translate", "--run", trained_run, stdin=b"a queen waited\nla reine \xe9tait\n")
    assert_refused(result, "line 2 of stdin is not UTF-8", "iconv")
    assert result.stdout == ""


@pytest.mark.skipif(os.name != "posix", reason="arguments as raw bytes need POSIX")
def test_translate_argument_that_is_not_utf8(trained_run):
    result = subprocess.run([sys.executable.encode(), b"-m", b"transformer_lib", b"translate", b"--run",
                             bytes(trained_run), b"a queen", b"la reine \xe9tait"], cwd=ROOT, env=ENV,
                            capture_output=True, timeout=300)
    result = subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(),
                                         result.stderr.decode())
    assert_refused(result, "sentence argument 2 is not valid UTF-8")


# --- the API cases of the same issue (decoding, exported from notebooks 12 and 13) -----------------------

@pytest.fixture(scope="module")
def tiny_model_and_tokenizer():
    from transformer_lib.model import TransformerConfig, build_transformer
    tokenizer = train_bpe_tokenizer(["a queen waited", "the king slept"] * 10, vocab_size=40)
    torch.manual_seed(0)
    model = build_transformer(TransformerConfig(tokenizer.vocab_size, tokenizer.vocab_size, d_model=16, n_heads=2,
                                                d_ff=32, n_encoder_layers=1, n_decoder_layers=1, max_len=32))
    return model.eval(), tokenizer


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -float("inf")])
def test_api_alpha_must_be_finite(tiny_model_and_tokenizer, alpha):
    from transformer_lib.decoding import beam_search
    from transformer_lib.evaluation import translate
    model, tokenizer = tiny_model_and_tokenizer
    src = torch.tensor([tokenizer.encode("a queen waited")])
    finite = r"alpha must be a finite number in \[-10, 10\] \(the paper uses 0.6.*got (nan|inf|-inf)"
    with pytest.raises(ValueError, match=finite):
        beam_search(model, src, None, tokenizer.bos_id, tokenizer.eos_id, beam_size=2, alpha=alpha)
    for beam_size in (1, 2):      # greedy ignores alpha, but a NaN there is a mistake all the same
        with pytest.raises(ValueError, match="alpha must be a finite number"):
            translate(model, tokenizer, ["a queen waited"], beam_size=beam_size, alpha=alpha)


def test_api_eos_id_equal_to_bos_id(tiny_model_and_tokenizer):
    from transformer_lib.decoding import beam_search, greedy_decode
    model, tokenizer = tiny_model_and_tokenizer
    src = torch.tensor([tokenizer.encode("a queen waited")])
    for decode in (greedy_decode, beam_search):
        with pytest.raises(ValueError, match="bos_id and eos_id must differ, got 1 for both"):
            decode(model, src, None, tokenizer.bos_id, tokenizer.bos_id)


# --- a run verifies itself: a file of another run, or edited, is named; the lock cannot be fooled ------

@pytest.fixture(scope="module")
def other_run(tmp_path_factory) -> Path:
    """Another run with the same settings but for its seed: the same shapes, the same tokenizer."""
    run = tmp_path_factory.mktemp("other") / "run"
    result = train(run, "--seed", "1")
    assert result.returncode == 0, result.stderr
    return run


@pytest.mark.parametrize("command", ["translate", "evaluate", "train"])
def test_checkpoint_of_another_run_is_refused(run, other_run, command):
    """It used to be used as this run's (evaluate: chrF 0.36 where its own gave 0.07)."""
    shutil.copy(other_run / "checkpoint.pt", run / "checkpoint.pt")
    before = snapshot(run)
    result = train(run, "--max-steps", "4") if command == "train" else use(run, command)
    assert_refused(result, "checkpoint.pt comes from another run", "run id")
    assert snapshot(run) == before


@pytest.mark.parametrize("edit, words", [({"n_heads": 1}, "model.n_heads 2 in the checkpoint, 1 in config.json"),
                                         ({"n_heads": 4}, "model.n_heads 2"),
                                         ({"layer_norm_eps": 0.5}, "model.layer_norm_eps")])
def test_config_edited_keeping_the_shapes_is_named(run, edit, words):
    """Another model with the same weights' shapes used to be built without a word."""
    meta = json.loads((run / "config.json").read_text())
    meta["model"].update(edit)
    (run / "config.json").write_text(json.dumps(meta))
    assert_refused(use(run, "translate"), "config.json was edited", words)


def test_reindented_tokenizer_is_still_this_runs(run):
    """Its fingerprint is of what it encodes, not of its JSON's spacing."""
    path = run / "tokenizer.json"
    path.write_text(json.dumps(json.loads(path.read_text(encoding="utf-8")), indent=4), encoding="utf-8")
    result = use(run, "translate")
    assert result.returncode == 0, result.stderr


def test_lock_file_that_is_a_symbolic_link_is_not_written_through(tmp_path):
    """`train` used to write its pid into whatever file train.lock pointed to."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.lock").symlink_to(precious)
    result = train(run)
    assert result.returncode == 0, result.stderr
    assert precious.read_text() == "keep me" and not (run / "train.lock").exists()


def test_folder_holding_only_another_runs_tokenizer_is_refused(tmp_path, other_run):
    """`train` used to replace it without a word."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(other_run / "tokenizer.json", run / "tokenizer.json")
    before = snapshot(run)
    assert_refused(train(run), "not a run folder", "tokenizer.json")
    assert snapshot(run) == before


def test_run_that_is_a_dangling_symbolic_link(tmp_path):
    """It used to say "[Errno 17] File exists"."""
    (tmp_path / "run").symlink_to(tmp_path / "nowhere")
    assert_refused(train(tmp_path / "run"), "symbolic link", "does not exist")
    assert_refused(cli("translate", "--run", tmp_path / "run", "a queen"), "missing")


@pytest.mark.parametrize("command", ["translate", "train"])
def test_folder_named_like_the_checkpoint(run, command):
    """It used to be called "missing", and `train` trained, then lost every step at the final save."""
    (run / "checkpoint.pt").unlink()
    (run / "checkpoint.pt").mkdir()
    before = snapshot(run)
    result = train(run, "--max-steps", "4") if command == "train" else use(run, "translate")
    assert_refused(result, "checkpoint.pt is a folder, not the run's file")
    assert snapshot(run) == before


@pytest.mark.parametrize("option, value, said", [("--cooldown", "0.5", "cooldown 0.0 -> 0.5 (--cooldown)"),
                                                 ("--lr-factor", "0.5", "lr_factor 1.0 -> 0.5 (--lr-factor)"),
                                                 ("--warmup", "10", "warmup 400 -> 10 (--warmup)")])
def test_schedule_changed_on_resume_is_said_and_recorded(run, option, value, said):
    """The NaN stop recommends a lower --lr-factor, which the same folder used to refuse; --cooldown
    was taken without a word while --warmup was refused. Now all three change, said and recorded."""
    result = train(run, "--max-steps", "4", option, value)
    assert result.returncode == 0, result.stderr
    assert f"changed on resume: {said}" in result.stderr
    meta = json.loads((run / "config.json").read_text())
    assert meta["changes"] == [{"step": 2, "change": said}]
    assert str(meta["training"][option[2:].replace("-", "_")]) == value
    again = train(run, "--max-steps", "6", option, value)       # the new value is now the run's own
    assert again.returncode == 0 and "changed on resume" not in again.stderr, again.stderr


def test_translate_with_stdin_closed(trained_run):
    """It used to raise an AttributeError traceback."""
    assert_refused(cli("translate", "--run", trained_run, stdin=None), "stdin is closed")


@pytest.mark.parametrize("alpha", ["1000", "1e308"])
def test_huge_alpha_with_beam_search(trained_run, alpha):
    """It used to raise an OverflowError traceback."""
    assert_refused(cli("translate", "--run", trained_run, "--beam", "4", "--alpha", alpha, "a queen waited"),
                   "alpha must be a finite number in [-10, 10]")


@pytest.mark.skipif(os.name != "posix", reason="POSIX links and permissions")
def test_output_onto_a_link_or_a_read_only_file(trained_run, tmp_path):
    """--output onto a link replaced the link, onto a read-only file replaced it: now refused before decoding."""
    target = tmp_path / "target.json"
    target.write_text("{}")
    (tmp_path / "link.json").symlink_to(target)
    assert_refused(cli("evaluate", "--run", trained_run, "--limit", "1", "--output", tmp_path / "link.json"),
                   "--output", "symbolic link")
    assert target.read_text() == "{}"
    if os.geteuid() != 0:                      # root may write a read-only file
        target.chmod(0o444)
        assert_refused(cli("evaluate", "--run", trained_run, "--limit", "1", "--output", target),
                       "--output", "cannot be replaced")


@pytest.mark.parametrize("option", ["--run", "--data-dir"])
def test_path_with_bytes_that_are_not_utf8(tmp_path, option):
    """A bare codec error used to come out (and leave tokenizer.json behind)."""
    bad = str(tmp_path / "caf\udce9")                   # how Python hands a non-UTF-8 byte of argv over
    args = (["--run", bad] if option == "--run" else
            ["--run", tmp_path / "run", "--data", "multi30k", "--data-dir", bad])
    assert_refused(cli("train", *TINY, *args), option, "not UTF-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_disk_full_at_the_first_checkpoint(tmp_path, monkeypatch):
    """torch's own error (inline_container.cc) used to come out as a traceback."""
    from transformer_lib import training

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")
    monkeypatch.setattr(training.torch, "save", full)
    result = train(tmp_path / "run")
    assert "precision: " in result.stderr                   # said before the first step
    assert_refused(last_line(result), "cannot write", "checkpoint.pt", "disk full",
                   "no checkpoint was saved yet, so these 1 steps are lost")


@pytest.mark.skipif(not hasattr(os, "kill"), reason="needs signals")
def test_interrupt_while_history_is_written_keeps_it_with_the_checkpoint(tmp_path, monkeypatch):
    """Ctrl-C while history.json was written used to leave it behind the checkpoint."""
    import signal

    from transformer_lib import runs
    real = runs.RunFolder._write_json

    def interrupted(self, name, value):
        if name == "history.json":
            os.kill(os.getpid(), signal.SIGINT)      # arrives while the file is written
        real(self, name, value)
    monkeypatch.setattr(runs.RunFolder, "_write_json", interrupted)
    result = train(tmp_path / "run")
    assert result.returncode == 130 and "interrupted at step 2" in result.stderr, result.stderr
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["steps"] == torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["state"]["step"]



def test_help_says_each_default_once_and_right():
    """`train --help` used to print "(default: …) (default: None)" on several options."""
    import dataclasses
    import re

    from transformer_lib.cli import build_parser
    from transformer_lib.settings import TrainSettings
    subparsers = next(a for a in build_parser()._actions if a.dest == "command").choices
    for command, parser in subparsers.items():
        text = " ".join(cli(command, "--help").stdout.split())
        assert "(default: None)" not in text and "(default: (default" not in text, command
        for action in parser._actions:
            assert (action.help or "").count("(default:") <= 1, (command, action.option_strings)
    fields = {f.metadata["option"]: f for f in dataclasses.fields(TrainSettings)}
    for action in subparsers["train"]._actions:
        f = fields.get(action.option_strings[0]) if action.option_strings else None
        if f is not None:
            shown = f.metadata["shown"] if f.metadata["shown"] is not None else f.default
            assert re.search(rf"\(default: {re.escape(str(shown))}\)$", action.help), (action.help, shown)
            assert action.dest == f.name and (action.default == f.default or f.metadata.get("flag"))


def test_folder_made_read_only_mid_run(tmp_path, monkeypatch):
    """It used to name train.lock, leave it locked behind, and lose the steps without saying so. Root
    writes anywhere, so the folder's refusal is made by failing the checkpoint's temporary file."""
    import errno

    from transformer_lib import runs, training
    real = training.os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).endswith("checkpoint.pt.tmp") and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)
    monkeypatch.setattr(training.os, "open", read_only)
    result = train(tmp_path / "run")
    assert "precision: " in result.stderr
    line = assert_refused(last_line(result), "cannot write", "checkpoint.pt at step 1", "Permission denied", "make",
                          "writable")
    assert "train.lock" not in line
    assert runs.lock_holder(tmp_path / "run") is None, "the lock is free for the next train"
