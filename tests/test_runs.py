"""Tests for the run folder (transformer_lib/runs.py), in this process: the lock that lets one
`train` write a folder (and frees itself when its holder dies), the checks that a folder can be
written before any work, every kind of hand-edited config.json named as such, the fingerprints,
atomic writes, and when a run is finished."""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from transformer_lib import run_paths, runs
from transformer_lib.model import TransformerConfig
from transformer_lib.runs import RunError

ROOT = Path(__file__).resolve().parent.parent


# --- the lock --------------------------------------------------------------------------------------

def test_second_lock_is_refused_with_the_holders_pid(tmp_path):
    run = tmp_path / "new" / "run"
    with runs.TrainLock(run):
        assert run.is_dir() and (run / runs.LOCK).read_text() == str(os.getpid())
        with pytest.raises(RunError, match=rf"another train \(pid {os.getpid()}\) is writing .*another --run folder"):
            with runs.TrainLock(run):
                pass
        assert (run / runs.LOCK).is_file(), "a refused lock leaves the holder's lock alone"
    assert not (tmp_path / "new").exists(), "the folders it created, still empty, are removed"


def test_lock_keeps_a_folder_that_holds_files(tmp_path):
    run = tmp_path / "run"
    with runs.TrainLock(run):
        (run / runs.CONFIG).write_text("{}")
    assert sorted(p.name for p in run.iterdir()) == [runs.CONFIG]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_lock_of_a_killed_process_is_taken_over(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from transformer_lib.runs import TrainLock
        with TrainLock({str(run)!r}):
            print("locked", flush=True)
            time.sleep(60)
        """)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunError, match=rf"pid {holder.pid}\)"):
            runs.TrainLock(run).__enter__()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    assert (run / runs.LOCK).read_text() == str(holder.pid), "the dead holder's lock file is still there"
    with runs.TrainLock(run):
        assert (run / runs.LOCK).read_text() == str(os.getpid())
    assert not (run / runs.LOCK).exists()


# --- can the folder be written? ------------------------------------------------------------------

def test_writable_checks(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    with pytest.raises(RunError, match=r"--run .*file is a file, not a folder"):
        runs.check_writable(regular, "--run", folder=True)
    with pytest.raises(RunError, match=r"--run .*file/sub: .*file is a file, so nothing can be created inside"):
        runs.check_writable(regular / "sub", "--run", folder=True)
    with pytest.raises(RunError, match=r"--output .* is a folder, not a file"):
        runs.check_writable(tmp_path, "--output", folder=False)
    runs.check_writable(tmp_path / "a" / "b", "--run", folder=True)      # missing folders can be made
    runs.check_writable(regular, "--output", folder=False)                # an existing file can be replaced
    assert sorted(tmp_path.iterdir()) == [regular], "the write test leaves nothing behind"


def test_unwritable_folder_is_refused(tmp_path, monkeypatch):
    """As root every folder is writable, so the refusal is shown by a write that fails."""
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(run_paths.tempfile, "mkstemp", refuse)
    with pytest.raises(RunError, match=r"--run .*: cannot write in .* \(Permission denied\); choose a folder"):
        runs.check_writable(tmp_path / "run", "--run", folder=True)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_folder_is_refused(tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(RunError, match="cannot write in"):
            runs.check_writable(tmp_path / "run", "--run", folder=True)
    finally:
        tmp_path.chmod(0o755)


def test_folder_with_other_files_gets_no_new_run(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".hidden").write_text("")
    with pytest.raises(RunError, match=r"is not a run folder \(no config.json\) and is not empty \(it holds notes.txt\)"):
        runs.check_new_run_folder(tmp_path)
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "tokenizer.json.tmp").write_text("{")   # left by a train killed before it began
    runs.check_new_run_folder(tmp_path)
    (tmp_path / runs.TOKENIZER).write_text("{}")        # another run's: never replaced without a word
    with pytest.raises(RunError, match=r"not empty \(it holds tokenizer.json\)"):
        runs.check_new_run_folder(tmp_path)


# --- config.json ---------------------------------------------------------------------------------

def a_config() -> dict:
    config = TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=16, n_heads=2, d_ff=32,
                               n_encoder_layers=1, n_decoder_layers=1, max_len=32)
    return runs.new_config(config, "builtin", None, None, None, 50, 1, 1,
                           {"seed": 0, "max_tokens": 512, "warmup": 400, "lr_factor": 1.0, "label_smoothing": 0.1},
                           "sha256:0", {"sha256": "0", "count": 3})


def test_config_round_trip(tmp_path):
    runs.write_json(tmp_path / runs.CONFIG, a_config())
    meta, config = runs.read_config(tmp_path)
    assert meta == a_config() and config.d_model == 16 and config.attention_dropout is None
    assert not list(tmp_path.glob("*.tmp"))


def edited(path: list, value):
    def edit(meta):
        target = meta
        for key in path[:-1]:
            target = target[key]
        if value is DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return meta
    return edit


DELETE = object()


@pytest.mark.parametrize("edit, words", [
    (edited(["model", "d_model"], "32"), ['"model"."d_model" is \'32\'', "an integer >= 1"]),
    (edited(["model", "n_heads"], 0), ['"model"."n_heads" is 0']),
    (edited(["model", "dropout"], 1.5), ['"model"."dropout" is 1.5', "< 1"]),
    (edited(["model", "attention_dropout"], "none"), ['"model"."attention_dropout"', "null or"]),
    (edited(["model", "norm_first"], "yes"), ['"model"."norm_first" is \'yes\'', "true or false"]),
    (edited(["model", "layer_norm_eps"], -1), ['"model"."layer_norm_eps" is -1']),
    (edited(["model", "max_len"], 1), ['"model"."max_len" is 1', ">= 2"]),
    (edited(["model", "max_len"], True), ['"model"."max_len" is True']),
    (edited(["model", "d_model"], 16.0), ['"model"."d_model" is 16.0']),
    (edited(["model", "widths"], 3), ["unknown settings ['widths']"]),
    (edited(["model", "src_vocab_size"], DELETE), ["no ['src_vocab_size']"]),
    (edited(["model"], [1, 2]), ['"model" is [1, 2]']),
    (edited(["data"], "wikipedia"), ['"data" is \'wikipedia\'', "builtin, multi30k, opus_books"]),
    (edited(["data"], DELETE), ["it has no 'data'"]),
    (edited(["src_lang"], 5), ['"src_lang" is 5']),
    (edited(["vocab_size"], -3), ['"vocab_size" is -3']),
    (edited(["accumulate"], 0), ['"accumulate" is 0']),
    (edited(["training", "seed"], 2 ** 70), ['"training"."seed"', "< 4294967296"]),
    (edited(["training", "lr_factor"], 0), ['"training"."lr_factor" is 0', "> 0"]),
    (edited(["training", "extra"], 1), ['"training" is']),
    (edited(["fingerprints"], None), ['"fingerprints" is None']),
    (edited(["format"], 7), ['"format" is 7', "another version"]),
    (lambda meta: [meta], ["it holds a JSON list, not an object"]),
])
def test_hand_edited_config_is_named(tmp_path, edit, words):
    runs.write_json(tmp_path / runs.CONFIG, edit(a_config()))
    with pytest.raises(RunError) as refused:
        runs.read_config(tmp_path)
    message = str(refused.value)
    for word in [str(tmp_path / runs.CONFIG), "edited or damaged", *words]:
        assert word in message, (word, message)


@pytest.mark.parametrize("content, words", [(b"{'model': 1", "not valid JSON"), (b"\xff\xfe{}", "not valid JSON"),
                                            (b"[" * 100000, "not valid JSON")])
def test_config_that_is_not_json(tmp_path, content, words):
    (tmp_path / runs.CONFIG).write_bytes(content)
    with pytest.raises(RunError, match=words):
        runs.read_config(tmp_path)


def test_format_1_config_is_read_without_training_settings(tmp_path):
    meta = a_config()
    for key in ("format", "training", "fingerprints", "vocab_size", "processes", "accumulate"):
        del meta[key]
    runs.write_json(tmp_path / runs.CONFIG, meta)
    assert runs.read_config(tmp_path)[0] == meta
    old = {**meta}
    runs.check_same_run(tmp_path, old, a_config())        # nothing recorded to compare: accepted
    with pytest.raises(RunError, match=r"d_model 16 -> 32 \(--d-model\)"):
        runs.check_same_run(tmp_path, old, edited(["model", "d_model"], 32)(a_config()))


@pytest.mark.parametrize("key, value, words", [("seed", 1, "seed 0 -> 1 (--seed)"),
                                               ("max_tokens", 256, "max_tokens 512 -> 256 (--max-tokens)"),
                                               ("label_smoothing", 0.0, "(--label-smoothing)")])
def test_training_settings_must_match_on_resume(tmp_path, key, value, words):
    with pytest.raises(RunError) as refused:
        runs.check_same_run(tmp_path, a_config(), edited(["training", key], value)(a_config()))
    assert words in str(refused.value) and "left as it was" in str(refused.value)


@pytest.mark.parametrize("key, value, words", [("warmup", 10, "warmup 400 -> 10 (--warmup)"),
                                               ("lr_factor", 2.0, "lr_factor 1.0 -> 2.0 (--lr-factor)"),
                                               ("cooldown", 0.2, "cooldown 0.0 -> 0.2 (--cooldown)")])
def test_schedule_may_change_on_resume_and_is_reported(tmp_path, key, value, words):
    """The schedule, which the message of a non-finite loss recommends changing, may change on
    resume (it was refused before): the change is returned, to be said and recorded."""
    assert runs.check_same_run(tmp_path, a_config(), edited(["training", key], value)(a_config())) == [words]
    assert runs.check_same_run(tmp_path, a_config(), a_config()) == []


def test_data_fingerprint():
    pairs = [("a b", "c"), ("d", "e f")]
    assert runs.fingerprint_pairs(pairs) == runs.fingerprint_pairs(list(pairs))
    assert runs.fingerprint_pairs(pairs)["count"] == 2
    assert runs.fingerprint_pairs(pairs) != runs.fingerprint_pairs([("a", "b c"), ("d", "e f")])
    assert runs.fingerprint_pairs(pairs) != runs.fingerprint_pairs(pairs[::-1])
    meta = a_config()
    meta["fingerprints"]["train_pairs"] = runs.fingerprint_pairs(pairs)
    runs.check_same_data(Path("r"), meta, runs.fingerprint_pairs(pairs), "--data builtin")
    with pytest.raises(RunError, match=r"the training pairs of --data builtin \(1 pairs\) are not those r was trained"):
        runs.check_same_data(Path("r"), meta, runs.fingerprint_pairs(pairs[:1]), "--data builtin")


# --- files ------------------------------------------------------------------------------------------

def test_write_atomic_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "history.json"
    runs.write_json(path, {"a": 1})

    def fail(tmp):
        tmp.write_text("half")
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        runs.write_atomic(path, fail)
    assert json.loads(path.read_text()) == {"a": 1} and not list(tmp_path.glob("*.tmp"))


# Fixed bytes, not os.urandom: a test id made of random bytes differs between the workers that
# collect it (tests/test_collection.py checks that ids never do).
NOISE = random.Random(0).randbytes(3000)


@pytest.mark.parametrize("content", [b"", NOISE, b"PK\x03\x04" + NOISE[:200]], ids=["empty", "noise", "zip_header"])
def test_checkpoint_that_is_not_one(tmp_path, content):
    (tmp_path / runs.CHECKPOINT).write_bytes(content)
    with pytest.raises(RunError) as refused:
        runs.read_checkpoint(tmp_path)
    assert "empty, truncated or not a checkpoint" in str(refused.value)
    assert "weights_only" not in str(refused.value)


def test_checkpoint_of_something_else(tmp_path):
    import torch
    torch.save({"model": {}, "state": {"step": "ten"}}, tmp_path / runs.CHECKPOINT)
    with pytest.raises(RunError, match="not a checkpoint of this library"):
        runs.read_checkpoint(tmp_path)


@pytest.mark.parametrize("state, max_steps, budget, words", [
    ({"step": 10, "elapsed": 1.0}, 10, None, "it has trained 10 steps (--max-steps)"),
    ({"step": 10, "elapsed": 1.0}, 5, None, "more than --max-steps 5"),
    ({"step": 10, "elapsed": 90.0}, 100, 60.0, "--time-budget of 60 s"),
    ({"step": 10, "elapsed": 1.0}, 11, None, None),
    ({"step": 10, "elapsed": 1.0}, None, 60.0, None),
])
def test_finished_reason(state, max_steps, budget, words):
    reason = runs.finished_reason(state, max_steps, budget)
    assert (reason is None) if words is None else words in reason


def imports_of(module: Path) -> set[str]:
    """The transformer_lib modules that `module` imports, at its top or inside a function."""
    import ast
    names = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and (node.level or node.module.startswith("transformer_lib")):
            base = node.module.removeprefix("transformer_lib").lstrip(".")
            names |= {base} if base else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name.removeprefix("transformer_lib.") for a in node.names if a.name.startswith("transformer_lib.")}
    return {name.split(".")[0] for name in names if name}


def test_no_import_cycle_and_nothing_imports_the_command_line():
    """Arrows point down: no module of transformer_lib imports one that (directly or not) imports it,
    counting imports inside functions; only __main__ imports cli; course_model lives in course.py, which
    imports train_run; runs.py imports no module of the text side or the model side at import time."""
    from transformer_lib import course
    graph = {p.stem: imports_of(p) for p in (ROOT / "transformer_lib").glob("*.py")}
    assert {name for name, imported in graph.items() if "cli" in imported} == {"__main__"}
    assert "train_run" in graph["course"] and callable(course.course_model)

    def reaches(start: str, goal: str, seen: set) -> bool:
        return any(n == goal or (n not in seen and not seen.add(n) and reaches(n, goal, seen))
                   for n in graph.get(start, ()))
    cycles = sorted(name for name in graph if reaches(name, name, set()))
    assert not cycles, f"modules on an import cycle: {cycles}"
    runs_source = (ROOT / "transformer_lib" / "runs.py").read_text(encoding="utf-8")
    for other in ("data", "decoding", "evaluation", "distributed", "cli", "course"):
        assert f"transformer_lib.{other} import" not in runs_source, other
    loaded = subprocess.run([sys.executable, "-c", "import sys; import transformer_lib.runs, transformer_lib.course; "
                             "print(sorted(m for m in sys.modules if m.startswith('transformer_lib')))"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert "torch" not in loaded.stdout and "'transformer_lib.model'" not in loaded.stdout
    assert set(eval(loaded.stdout)) == {"transformer_lib", "transformer_lib.course", "transformer_lib.runs",
                                        "transformer_lib.run_config", "transformer_lib.run_lock",
                                        "transformer_lib.settings", "transformer_lib.files",
                                        "transformer_lib.run_paths"}


def test_a_run_being_trained_without_a_checkpoint_yet(tmp_path):
    """translate during a first train's first steps: say that a train is writing it, not 'train first'."""
    run = tmp_path / "run"
    with runs.TrainLock(run):
        runs.write_json(run / runs.CONFIG, a_config())
        with pytest.raises(RunError, match=rf"checkpoint.pt is missing: a train \(pid {os.getpid()}\) is writing"):
            runs.check_readable_run(run)
        assert runs.lock_holder(run) == str(os.getpid())
    (run / runs.LOCK).write_text("12345")             # left by a train that ended: free, so not named
    assert runs.lock_holder(run) is None
    with pytest.raises(RunError, match=r"checkpoint.pt is missing: train first: python -m transformer_lib train"):
        runs.check_readable_run(run)


def test_output_onto_a_file_of_a_run_is_refused(tmp_path):
    runs.write_json(tmp_path / runs.CONFIG, a_config())
    for name in (runs.CONFIG, runs.CHECKPOINT, runs.HISTORY):
        with pytest.raises(RunError, match=rf"--output .*{name} would overwrite the {name} of the run in"):
            runs.check_not_a_run_file(tmp_path / name, "--output")
    runs.check_not_a_run_file(tmp_path / "metrics.json", "--output")
    runs.check_not_a_run_file(tmp_path / "elsewhere" / runs.CONFIG, "--output")     # not a run folder


def test_batches_padded_for_compile_must_match_on_resume(tmp_path):
    """--compile pads batches to a multiple of 8, which makes other batches: a resume must agree. A
    run that does not record it was padded to 1."""
    padded = runs.new_config(TransformerConfig(50, 50, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                                               n_decoder_layers=1, max_len=32), "builtin", None, None, None, 50, 1,
                             1, a_config()["training"], "sha256:0", {"sha256": "0", "count": 3}, pad_to_multiple=8)
    with pytest.raises(RunError, match=r"pad_to_multiple 1 -> 8 \(--pad-to-multiple, or --compile"):
        runs.check_same_run(tmp_path, a_config(), padded)
    unrecorded = a_config()
    del unrecorded["pad_to_multiple"]
    runs.check_same_run(tmp_path, unrecorded, a_config())
    runs.write_json(tmp_path / runs.CONFIG, edited(["pad_to_multiple"], 0)(a_config()))
    with pytest.raises(RunError, match='"pad_to_multiple" is 0'):
        runs.read_config(tmp_path)


def test_deleted_lock_file_does_not_free_the_folder(tmp_path):
    """A second train used to start when train.lock was deleted by hand: both wrote checkpoint.pt."""
    run = tmp_path / "run"
    with runs.TrainLock(run):
        (run / runs.LOCK).unlink()
        with pytest.raises(RunError, match=r"another train \(pid unknown\) is writing"):
            runs.TrainLock(run).__enter__()


@pytest.mark.skipif(os.name != "posix", reason="POSIX links")
def test_lock_file_link_is_replaced_not_followed(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / runs.LOCK).symlink_to(precious)
    (run / (runs.LOCK + ".tmp")).symlink_to(precious)       # nor through a link at its temporary name
    with runs.TrainLock(run):
        assert not (run / runs.LOCK).is_symlink() and (run / runs.LOCK).read_text() == str(os.getpid())
    assert precious.read_text() == "keep me"


def test_json_that_is_not_json_is_refused(tmp_path):
    """write_json used to write NaN, which is not JSON."""
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        runs.write_json(tmp_path / "history.json", {"loss": float("nan")})
    assert not list(tmp_path.iterdir())


def test_wrong_types_are_named():
    """runs.py functions given wrong types used to raise raw AttributeError/KeyError."""
    from transformer_lib.settings import TrainSettings
    from transformer_lib.train_run import train_run
    with pytest.raises(TypeError, match="a run folder is a path"):
        runs.RunFolder(3)
    with pytest.raises(TypeError, match="settings must be a TrainSettings, got dict"):
        train_run("r", {"d_model": 32})
    with pytest.raises(TypeError, match=r"d_model \(--d-model\) must be a positive integer"):
        TrainSettings(d_model="128")
    with pytest.raises(ValueError, match=r"cooldown \(--cooldown\) must be a number in \[0, 1\), got 1.5"):
        TrainSettings(cooldown=1.5)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_absent_cuda_device_through_the_api(tmp_path):
    """Asking the API for an absent CUDA device used to give torch's raw error."""
    from transformer_lib.train_run import load_run
    with pytest.raises(RunError, match=r"--device cuda:1: this torch sees no CUDA GPU"):
        load_run(tmp_path, "cuda:1")
