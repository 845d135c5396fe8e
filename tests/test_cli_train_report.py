"""Training your own pair (issue 32): `train` says what it read (pairs per split, where each came
from, what was dropped and where), the model and the precision, shows a bar with the total and time
left and the validation loss, and ends with where the run is and the `evaluate` command; it never
waits forever on a pipe, keeps the run's files in agreement after a failed write, follows a folder
moved while it trains, and checks before the first step what it can. In-process through `main(argv)`
on tiny files; one module fixture trains, the other cases train 2 steps or are refused before any."""
import errno
import json
import os
import shutil
import threading
import zipfile
from pathlib import Path

import pytest
import torch

from test_cli_data import PAIRS, TINY, recorded, train, write_files
from test_cli_errors import assert_refused, cli, last_line

LONG = " ".join(["long"] * 60)      # more than --max-len 32 tokens


def train_files(run: Path, *extra):
    """A 2-step tiny train on 60 pairs written beside `run`."""
    src, tgt = write_files(run.parent, PAIRS)
    return train(run, "--data", f"files:{src},{tgt}", *extra)


@pytest.fixture(scope="module")
def own_pair(tmp_path_factory):
    """A run on relative file names with --valid given (so no test split is carved), one training pair
    too long for --max-len (line 6), trained from inside the data's folder; its result."""
    folder = tmp_path_factory.mktemp("own_pair")
    pairs = list(PAIRS[:40])
    pairs[5] = (LONG, "lang")
    write_files(folder, pairs)
    write_files(folder, PAIRS[40:50], "valid")
    here = Path.cwd()
    os.chdir(folder)
    try:
        result = train(Path("run"), "--data", "files:train", "--src-lang", "en", "--tgt-lang", "de",
                       "--valid", "valid", "--max-steps", "10", "--validate-every", "10")
    finally:
        os.chdir(here)
    assert result.returncode == 0, result.stderr
    return folder, result


def test_train_says_what_it_read_and_how_to_score_it(own_pair):
    folder, result = own_pair
    said = result.stderr
    assert "training          40 pairs  from train.en and train.de" in said, said
    assert "validation        10 pairs  from valid.en and valid.de" in said
    assert "test               0 pairs  none: --valid is given, so none are carved" in said
    assert "dropped 1 training pair(s) longer than --max-len 32 tokens" in said
    assert "the first: line 6 of train.en and train.de" in said
    assert "parameters" in said and "precision: float32" in said
    assert "step 10: validation loss" in said                     # without a bar, each validation is a line
    assert "validation loss" in said.splitlines()[-3] and "the folder run" in said.splitlines()[-2]
    assert said.splitlines()[-1].endswith("python -m transformer_lib evaluate --run run --split valid (it has no "
                                          "test split; score your own test pairs with --data files:SRC,TGT, tsv:FILE "
                                          "or csv:FILE)")
    summary = json.loads(result.stdout)
    assert summary["pairs"] == {"train": 40, "valid": 10, "test": 0} and summary["valid_loss"] > 0
    assert recorded(folder / "run")["source"]["train"] == [str(folder / "train.en"), str(folder / "train.de")]


def test_evaluate_from_another_working_folder(own_pair, tmp_path, monkeypatch):
    """It used to say "its files changed since training" when only the working folder differed."""
    folder, _ = own_pair
    monkeypatch.chdir(tmp_path)
    result = cli("evaluate", "--run", folder / "run", "--split", "valid", "--limit", "2")
    assert result.returncode == 0, result.stderr


def test_data_moved_after_training_then_resumed(own_pair, tmp_path):
    """evaluate names the --data to give; a resume from the moved files records where they are now."""
    folder, _ = own_pair
    run, data = tmp_path / "run", tmp_path / "moved"
    shutil.copytree(folder / "run", run)
    data.mkdir()
    copy = {name: data / name for name in ("train.en", "train.de", "valid.en", "valid.de")}
    for name, path in copy.items():
        shutil.copy(folder / name, path)
    source = recorded(run)["source"]
    source["train"] = [str(tmp_path / "gone.en"), str(tmp_path / "gone.de")]
    meta = {**recorded(run), "source": source}
    (run / "config.json").write_text(json.dumps(meta))
    assert_refused(cli("evaluate", "--run", run, "--split", "valid"), "gone.en", "not there now",
                   "--data files:SRC,TGT")
    result = train(run, "--data", f"files:{data}/train", "--src-lang", "en", "--tgt-lang", "de", "--valid",
                   f"{data}/valid", "--max-steps", "12", "--validate-every", "10")
    assert result.returncode == 0, result.stderr
    assert recorded(run)["source"]["train"] == [str(copy["train.en"]), str(copy["train.de"])]
    assert cli("evaluate", "--run", run, "--split", "valid", "--limit", "1").returncode == 0


def test_a_bar_with_the_total_the_time_left_and_the_validation_loss(tmp_path):
    src, tgt = write_files(tmp_path, PAIRS)
    result = cli("train", "--run", tmp_path / "run", *[a for a in TINY if a != "--no-progress"], "--data",
                 f"files:{src},{tgt}", "--max-steps", "10", "--validate-every", "10")
    assert result.returncode == 0, result.stderr
    assert "100%|" in result.stderr and "step 10/10" in result.stderr and " left" in result.stderr
    assert "validation loss" in result.stderr.split("100%|")[-1]


def test_time_budget_says_what_it_counts():
    help_text = " ".join(cli("train", "--help").stdout.split())
    assert "time spent in training steps" in help_text


# --- never hang, never lose silently -------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_without_a_writer_is_named_and_takes_no_lock(tmp_path, monkeypatch):
    """It used to hang forever, holding train.lock."""
    from transformer_lib import data_files
    monkeypatch.setattr(data_files, "FIFO_WAIT_S", 0.3)
    pipe = tmp_path / "pipe.en"
    os.mkfifo(pipe)
    _, tgt = write_files(tmp_path, PAIRS)
    assert_refused(train(tmp_path / "run", "--data", f"files:{pipe},{tgt}"), "pipe.en is a named pipe",
                   "no process opened for writing", "start its writer first")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_whose_writer_ends_before_it_is_read(tmp_path):
    """The writer may write everything and exit before the reader opens the pipe again."""
    pipe = tmp_path / "pipe.en"
    os.mkfifo(pipe)
    src, tgt = write_files(tmp_path, PAIRS)
    writer = threading.Thread(target=lambda: pipe.write_bytes(src.read_bytes()))
    writer.start()
    result = train(tmp_path / "run", "--data", f"files:{pipe},{tgt}")
    writer.join()
    assert result.returncode == 0, result.stderr
    assert recorded(tmp_path / "run")["fingerprints"]["train_pairs"]["count"] == 54


def test_folder_moved_while_training_keeps_its_checkpoint(tmp_path, monkeypatch):
    """The train used to recreate the old path with only checkpoint.pt in it, and strand its steps there."""
    from transformer_lib import runs
    real, src_tgt = runs.RunFolder.save_checkpoint, write_files(tmp_path, PAIRS)

    def moved_first(self, *args, **kwargs):
        if self.path.exists():
            os.rename(self.path, tmp_path / "moved")
        return real(self, *args, **kwargs)
    monkeypatch.setattr(runs.RunFolder, "save_checkpoint", moved_first)
    result = train(tmp_path / "run", "--data", "files:{},{}".format(*src_tgt), "--max-steps", "3")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "run").exists()
    assert f"the run is in the folder {tmp_path / 'moved'} (moved there from {tmp_path / 'run'}" in result.stderr
    assert json.loads((tmp_path / "moved" / "history.json").read_text())["steps"] == 3
    assert sorted(p.name for p in (tmp_path / "moved").iterdir()) == ["checkpoint.pt", "config.json", "history.json",
                                                                      "tokenizer.json"]


def test_every_write_of_a_run_folder_needs_its_lock(tmp_path):
    """start() from another process used to rewrite config.json while a train held the folder."""
    from transformer_lib.runs import RunError, RunFolder
    folder = RunFolder(tmp_path)
    for write in (lambda: folder.start({"format": 3}), lambda: folder.save_checkpoint({"state": {"step": 1}}),
                  lambda: folder.write_history({"steps": 1})):
        with pytest.raises(RunError, match="needs the folder's lock"):
            write()
    assert list(tmp_path.iterdir()) == []


def test_history_that_fails_after_the_checkpoint_is_said_and_repaired(tmp_path, monkeypatch):
    """It used to say the checkpoint failed and its steps were lost, and never write history.json again."""
    from transformer_lib import runs
    real = runs.RunFolder._write_json

    def full(self, name, value):
        if name == "history.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, name, value)
    monkeypatch.setattr(runs.RunFolder, "_write_json", full)
    run = tmp_path / "run"
    line = assert_refused(last_line(train_files(run)), "cannot write", "history.json at step 2", "checkpoint.pt holds step 2",
                          "no training is lost")
    assert "checkpoint.pt at" not in line and not (run / "history.json").exists()
    monkeypatch.setattr(runs.RunFolder, "_write_json", real)
    again = train_files(run)
    assert again.returncode == 0 and "is finished" in again.stderr, again.stderr
    assert json.loads((run / "history.json").read_text())["steps"] == 2


@pytest.mark.parametrize("fault, words", [("immutable", ["checkpoint.pt is immutable or append-only", "chattr"]),
                                          ("full", ["MB free on its disk", "a checkpoint of this model takes"])],
                         ids=["immutable-checkpoint", "full-disk"])
def test_what_a_save_needs_is_checked_before_the_first_step(tmp_path, monkeypatch, fault, words):
    """An immutable checkpoint.pt used to be found at the first save, its steps lost."""
    import types

    from transformer_lib import run_paths, runs
    run = tmp_path / "run"
    assert train_files(run).returncode == 0
    if fault == "immutable":
        monkeypatch.setattr(runs, "unreplaceable", lambda path: path.name == "checkpoint.pt")
    else:
        monkeypatch.setattr(runs.os, "fstatvfs", lambda fd: types.SimpleNamespace(f_bavail=10, f_frsize=4096),
                            raising=False)
    before = (run / "checkpoint.pt").read_bytes()
    assert_refused(last_line(train_files(run, "--max-steps", "4")), *words)
    assert (run / "checkpoint.pt").read_bytes() == before
    assert run_paths.unreplaceable(run / "config.json") is False


# --- refusals that name the fix ------------------------------------------------------------------

def _xlsx(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as book:
        book.writestr("[Content_Types].xml", "<Types/>")
        book.writestr("xl/workbook.xml", "<workbook/>")
    return path


def _write(path: Path, data: bytes, spec: str) -> str:
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return spec


REFUSED = {   # id: (make the file under test in a folder (returns --data), words of the error line)
    "near-miss": (lambda d: f"files:{write_files(d, PAIRS)[0]},{d / 'train.dee'}", ["no such file", "did you mean",
                                                                                  "train.de"]),
    "spark-parts": (lambda d: _write(d / "out" / "part-00000", b"a\tb\n", f"tsv:{d / 'out'}"),
                    ["folder of 1 part files", "cat", "part-*"]),
    "xlsx": (lambda d: f"csv:{_xlsx(d / 'pairs.xlsx')}", ["an Excel workbook", "CSV UTF-8", "--data csv:"]),
    "nul-bytes": (lambda d: _write(d / "t.tsv", b"\0" * 5000, f"tsv:{d / 't.tsv'}"),
                  ["only NUL bytes", "download or copy it again"]),
    "dangling-link": (lambda d: (d / "t.tsv").symlink_to(d / "nowhere.tsv") or f"tsv:{d / 't.tsv'}",
                      ["symbolic link", "does not exist", "ln -sfn"]),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_a_refusal_names_the_fix(tmp_path, case):
    make, words = REFUSED[case]
    assert_refused(train(tmp_path / "run", "--data", make(tmp_path)), *words)
    assert not (tmp_path / "run").exists()


def test_permission_denied_names_chmod(tmp_path, monkeypatch):
    """It used to be the raw "[Errno 13] Permission denied". Root reads anything, so open() refuses here."""
    import builtins
    path = tmp_path / "t.tsv"
    path.write_text("a\tb\n")
    real = builtins.open

    def denied(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", denied)
    assert_refused(train(tmp_path / "run", "--data", f"tsv:{path}"), "permission denied", "chmod u+r")


def test_files_prefix_finds_compressed_files(tmp_path):
    """files:PREFIX looked for PREFIX.en only; Multi30k ships train.en.gz."""
    import gzip

    from transformer_lib.settings import TrainSettings
    for lang in ("en", "de"):
        with gzip.open(tmp_path / f"train.{lang}.gz", "wt") as f:
            f.write("a\n")
    source = TrainSettings(data=f"files:{tmp_path}/train", src_lang="en", tgt_lang="de").source
    assert source.train == (f"{tmp_path}/train.en.gz", f"{tmp_path}/train.de.gz")


@pytest.mark.parametrize("given", ["tab", "\\t", "\t"], ids=["name", "escape", "character"])
def test_the_tab_as_a_delimiter(given):
    """--delimiter $'\\t' and '\\t' used to be refused."""
    from transformer_lib.settings import TrainSettings
    assert TrainSettings(data="tsv:pairs.tsv", delimiter=given).source.kind == "tsv"
    assert TrainSettings(data="csv:pairs.tsv", delimiter=given).source.delimiter == "\t"


def test_a_header_row_is_warned_about(tmp_path):
    from transformer_lib.data_files import header_warning
    from transformer_lib.sources import DataSource
    path = tmp_path / "pairs.csv"
    path.write_text("en,fr\nHello,Bonjour\n")
    assert "looks like a header" in header_warning(DataSource("csv", train=str(path)))
    assert header_warning(DataSource("csv", train=str(path), header=True)) is None
    path.write_text("Hello,Bonjour\n")
    assert header_warning(DataSource("csv", train=str(path))) is None


def test_attention_map_has_a_size_limit(own_pair, tmp_path, monkeypatch):
    """A 499-token sentence used to take 6.7 GB and write a PNG no viewer opens."""
    from transformer_lib import cli as cli_module
    folder, _ = own_pair
    monkeypatch.setattr(cli_module, "ATTENTION_MAX_TOKENS", 4)
    assert_refused(cli("translate", "--run", folder / "run", "--attention", tmp_path / "a.png", "red fox sees a bird"),
                   "an attention map draws at most 4", "without --attention")
    assert not (tmp_path / "a.png").exists()


def test_evaluate_leaves_out_a_sentence_longer_than_max_len_and_says_so(own_pair, tmp_path):
    """It used to refuse the whole split, naming "sentence 2 of test", a position the user could not find."""
    folder, _ = own_pair
    src, tgt = write_files(tmp_path, [PAIRS[0], (LONG, "lang"), PAIRS[1]])
    result = cli("evaluate", "--run", folder / "run", "--data", f"files:{src},{tgt}")
    assert result.returncode == 0, result.stderr
    assert "1 of the 3 sentences" in result.stderr and "the first is sentence 2 (counting from 1)" in result.stderr
    assert json.loads(result.stdout)["skipped"] == 1 and json.loads(result.stdout)["sentences"] == 2


def test_a_full_disk_at_the_tokenizer_is_one_line(tmp_path, monkeypatch):
    """It used to be the tokenizers library's traceback."""
    from transformer_lib import runs
    real = runs.RunFolder._write

    def full(self, name, write):
        if name.endswith("tokenizer.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, name, write)
    monkeypatch.setattr(runs.RunFolder, "_write", full)
    assert_refused(last_line(train_files(tmp_path / "run")), "cannot write", "tokenizer.json", "No space left",
                   "No run was begun")
    assert not (tmp_path / "run").exists()
