"""Tests for the command line (transformer_lib/cli.py) on bad input: every problem is one `error:`
line and exit code 2 (never a traceback), and a refused `train` leaves the run folder as it was,
byte for byte. Each case runs the real `python -m transformer_lib`; they share one tiny trained run,
copied per test."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lib.tokenization import SubwordTokenizer, train_bpe_tokenizer

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
MAX_LEN = 32
# A model small enough to train in a second; max_len is small so that long inputs are cheap to make.
TINY = ["--data", "builtin", "--vocab-size", "200", "--d-model", "16", "--heads", "2", "--d-ff", "32",
        "--layers", "1", "--max-len", str(MAX_LEN), "--max-tokens", "512", "--max-steps", "2",
        "--checkpoint-every", "1", "--threads", "1", "--device", "cpu", "--no-progress", "--seed", "0"]


def cli(*args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer_lib", *map(str, args)], cwd=ROOT, env=ENV,
                          input=stdin, capture_output=True, text=True, timeout=300)


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
    ("--threads", "0", ["--threads", "positive"]),
    ("--threads", "-2", ["--threads", "positive"]),
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


# --- an existing run: resumed only with its own configuration ---------------------------------------

@pytest.mark.parametrize("extra, words", [
    (["--d-model", "32", "--heads", "4"], ["d_model 16 -> 32 (--d-model)", "n_heads 2 -> 4 (--heads)"]),
    (["--vocab-size", "400"], ["vocab_size 200 -> 400 (--vocab-size)"]),
    (["--post-ln", "--max-len", "64"], ["norm_first True -> False (--post-ln)", "max_len 32 -> 64"]),
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


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_tokenizer_and_config_disagree_on_vocabulary(run, command):
    other = train_bpe_tokenizer(["a queen waited", "the king slept"] * 10, vocab_size=40)
    other.save(run / "tokenizer.json")
    assert_refused(use(run, command), "tokenizer.json", "config.json", "disagree on the vocabulary")


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
