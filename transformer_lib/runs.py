"""The run folder: one object that opens or creates itself, knows its files and refuses any that
is not its own.

Hand-written, not exported: the command line, `train_run` and `course_model` use it, so no one
notebook is its home. A run folder holds

    config.json     what the run is (`run_config.py`): the model configuration, the data, the
                    settings that decide its updates, fingerprints of its tokenizer and data
    tokenizer.json  the BPE tokenizer the model was trained with
    checkpoint.pt   everything to resume training (`Trainer.checkpoint()`), with the run's identity:
                    its model configuration and the fingerprints of its tokenizer and training data
    history.json    the summary and logged losses of the checkpoint's step, once a `train` ran to its
                    end (removed before a resumed train replaces that checkpoint: never behind it)
    train.lock      while a `train` runs: its process id (the lock itself is on the folder)

Every load compares checkpoint.pt, config.json and tokenizer.json and names the file that
disagrees. Every file is written atomically (a new temporary file, flushed, renamed onto it). One
`train` at a time: it holds `flock` on the folder itself, which neither a symbolic link named
train.lock nor a deleted train.lock can defeat. A problem the user can fix raises `RunError`.
"""
import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from transformer_lib.run_config import (AMP_DTYPES, CONFIG, DEFAULT_LANGS, FORMAT, OPTION_OF_FIELD,  # noqa: F401
                                        RunError, check_same_data, check_same_run, new_config, one_line, read_config)
from transformer_lib.files import fingerprint_pairs, write_atomic  # noqa: F401  (runs.write_atomic, as before)
from transformer_lib.run_lock import LOCK, TrainLock, lock_holder
from transformer_lib.settings import CHANGEABLE_ON_RESUME, CORPORA, SEED_LIMIT  # noqa: F401

TOKENIZER, CHECKPOINT, HISTORY = "tokenizer.json", "checkpoint.pt", "history.json"
RUN_FILES = (CONFIG, TOKENIZER, CHECKPOINT, HISTORY, LOCK)


# --- paths ----------------------------------------------------------------------------------------

def _nearest_existing(path: Path) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            return folder
    return Path.cwd()


def check_path_text(path: Path, option: str) -> None:
    """RunError for a path holding bytes that are not UTF-8 (they reach Python as lone surrogates)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise RunError(f"{option} {os.fsencode(path)!r}: the path holds bytes that are not UTF-8; rename it, or "
                       "give a path without them") from None


def check_writable(path: Path, option: str, folder: bool) -> None:
    """RunError unless this process can create or replace `path` (a folder if `folder`, else a
    file): nothing in the way is a file (or, for a file, a folder), no link points nowhere, and the
    nearest existing folder accepts a new file, tried by writing and removing one there."""
    check_path_text(path, option)
    if path.is_symlink() and not path.exists():
        raise RunError(f"{option} {path} is a symbolic link to {os.readlink(path)}, which does not exist; create "
                       "that folder, or give another path" if folder else
                       f"{option} {path} is a symbolic link to {os.readlink(path)}, which does not exist; give "
                       "another path")
    if path.exists() and path.is_dir() != folder:
        kind = "a file, not a folder" if folder else "a folder, not a file"
        raise RunError(f"{option} {path} is {kind}; give a {'folder' if folder else 'file'} path")
    existing = _nearest_existing(path if folder else path.parent)     # a file is replaced from its folder
    if not existing.is_dir():
        raise RunError(f"{option} {path}: {existing} is a file, so nothing can be created inside it; "
                       "give a path under a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise RunError(f"{option} {path}: cannot write in {existing} ({error.strerror or one_line(error)}); "
                       "choose a folder you can write, or change its permissions") from None


def check_output_file(path: Path, option: str) -> None:
    """RunError, before any work, unless `path` can be written as an output file: not a link (which
    would be replaced), not read-only or immutable (tried by opening it for appending), not a run file."""
    check_writable(path, option, folder=False)
    if path.is_symlink():
        raise RunError(f"{option} {path} is a symbolic link (to {os.readlink(path)}), which would be replaced by a "
                       "file; give the path of the file itself")
    if path.exists():
        try:
            with open(path, "ab"):
                pass
        except OSError as error:
            raise RunError(f"{option} {path} cannot be replaced ({error.strerror or one_line(error)}); make it "
                           "writable or give another file") from None
    check_not_a_run_file(path, option)


def check_not_a_run_file(path: Path, option: str) -> None:
    """RunError when `path` (an output file) is one of the files of the run folder it lies in."""
    if path.name in RUN_FILES and (path.parent / CONFIG).is_file():
        raise RunError(f"{option} {path} would overwrite the {path.name} of the run in {path.parent}; "
                       "write the output to another file")


def check_readable_run(run: Path) -> None:
    """RunError unless `run` is a folder holding a run's config.json and checkpoint.pt as files."""
    check_path_text(run, "--run")
    if run.exists() and not run.is_dir():
        raise RunError(f"--run {run} is a file, not a run folder; give the folder that `train` wrote")
    for name in (CHECKPOINT, CONFIG):
        if (run / name).exists() and not (run / name).is_file():
            raise RunError(f"{run / name} is a folder, not the run's file; remove it and restore the file, or "
                           "train into a new --run folder")
        if not (run / name).is_file():
            holder = lock_holder(run)
            raise RunError(f"{run / name} is missing: " + (
                f"a train (pid {holder}) is writing {run} and has saved no checkpoint yet; wait for its first one"
                if holder else f"train first: python -m transformer_lib train --run {run} ..."))


def check_new_run_folder(run: Path) -> None:
    """A folder without config.json gets a new run only if it holds nothing but hidden files and the
    leftovers of a `train` killed before it began (*.tmp, the lock): a run is never written over
    other files, a tokenizer.json (another run's, or its own whose config.json is lost), or a
    checkpoint whose config.json is lost."""
    if run.is_dir():
        others = sorted(p.name for p in run.iterdir() if not (p.name.startswith(".") or p.name == LOCK
                                                              or p.name.endswith(".tmp")))
        if others:
            raise RunError(f"--run {run} is not a run folder (no {CONFIG}) and is not empty (it holds "
                           f"{', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); train into a new or "
                           "empty folder, or delete what is left of a damaged run")


# --- writing ----------------------------------------------------------------------------------------

def write_json(path: Path, value) -> None:
    """JSON, atomically; ValueError for NaN or infinity, which JSON cannot hold."""
    text = json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)
    write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


# --- fingerprints ----------------------------------------------------------------------------------

def fingerprint_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fingerprint_tokenizer(text: str) -> str:
    """SHA-256 of what a tokenizer.json encodes (its JSON with sorted keys, no spacing), so that a
    re-indented file keeps its fingerprint and a changed merge or token does not."""
    return fingerprint_bytes(json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"),
                                        ensure_ascii=False).encode("utf-8"))


# --- reading and checking --------------------------------------------------------------------------

def load_tokenizer(run: Path, meta: dict, config):
    """The run's tokenizer, checked against config.json: its fingerprint (format 2 on), else its
    size and padding id (format 1)."""
    from tokenizers import Tokenizer

    from transformer_lib.tokenization import SubwordTokenizer
    path = run / TOKENIZER
    if not path.is_file():
        raise RunError(f"{path} is missing; restore it from the run that wrote it, or train into a new --run folder")
    data = path.read_bytes()
    recorded = meta.get("fingerprints", {}).get("tokenizer")
    try:
        text = data.decode("utf-8")
        tokenizer, fingerprint = SubwordTokenizer(Tokenizer.from_str(text)), fingerprint_tokenizer(text)
    except Exception as error:   # the tokenizers library raises a bare Exception for a damaged file
        raise RunError(f"{path} is not a readable tokenizer ({one_line(error)[:160]}); restore it from the run "
                       "that wrote it, or train into a new --run folder") from None
    if recorded is not None and recorded not in (fingerprint, fingerprint_bytes(data)):   # bytes: format 2
        raise RunError(f"{path} is not the tokenizer this run was trained with (its fingerprint differs from the one "
                       f"in {run / CONFIG}): it comes from another run; put back this run's {TOKENIZER}, or train "
                       "into a new --run folder")
    if (tokenizer.vocab_size, tokenizer.pad_id) != (config.src_vocab_size, config.pad_id) \
            or config.tgt_vocab_size != config.src_vocab_size:
        raise RunError(f"{path} ({tokenizer.vocab_size} tokens, padding id {tokenizer.pad_id}) and {run / CONFIG} "
                       f"(src_vocab_size={config.src_vocab_size}, tgt_vocab_size={config.tgt_vocab_size}, "
                       f"pad_id={config.pad_id}) disagree on the vocabulary: they come from different runs; "
                       "keep the files of one run together")
    tokenizer.fingerprint = fingerprint
    return tokenizer


def read_checkpoint(run: Path, device="cpu") -> dict:
    """checkpoint.pt as a dict with "model" weights and a "state" with its step; RunError naming the
    file when it is empty, truncated, holds code, or is not a checkpoint at all."""
    from transformer_lib.training import load_checkpoint
    path = run / CHECKPOINT
    try:
        checkpoint = load_checkpoint(path, map_location=device)
    except ValueError as error:
        if "other than tensors" in str(error):          # it holds code: say so, not "damaged"
            raise RunError(one_line(error)) from None
        checkpoint = None
    state = checkpoint.get("state") if isinstance(checkpoint, dict) else None
    if not (isinstance(state, dict) and isinstance(state.get("step"), int)
            and isinstance(checkpoint.get("model"), dict)):
        raise RunError(f"{path} is empty, truncated or not a checkpoint of this library; restore it from a backup, "
                       "or delete it to train from scratch")
    return checkpoint


def identity(meta: dict) -> dict:
    """What a checkpoint carries of its run: the run's id, model configuration, fingerprints and the
    training settings that may not change on resume."""
    training = {k: v for k, v in meta.get("training", {}).items() if k not in CHANGEABLE_ON_RESUME}
    return {"run_id": meta.get("run_id"), "model": meta["model"], "fingerprints": meta.get("fingerprints"),
            "training": training, **({"source": meta["source"]} if "source" in meta else {})}


def check_identity(run: Path, meta: dict, checkpoint: dict) -> None:
    """RunError naming the file that disagrees when checkpoint.pt's identity is not config.json's: a
    checkpoint of another run (another run id), or a config.json edited in a way that keeps the
    weights' shapes (its model, fingerprints or fixed training settings differ from the checkpoint's)."""
    carried = (checkpoint.get("extra") or {}).get("run")
    path, config_path = run / CHECKPOINT, run / CONFIG
    if carried is None:
        if meta.get("format", 1) >= FORMAT:
            raise RunError(f"{path} carries no run identity, so this run's train did not write it: it comes from "
                           "another run or an older version; put back this run's checkpoint, or delete it to train "
                           "from scratch")
        return                                      # written before checkpoints carried one
    own = identity(meta)
    if not isinstance(carried, dict) or not all(isinstance(carried.get(k), dict) for k in ("model", "training")):
        raise RunError(f"{path} carries a damaged run identity; restore it from a backup, or delete it")
    # What an older config.json (format 1 or 2) does not record is not compared.
    if own["run_id"] is not None and carried.get("run_id") != own["run_id"]:
        raise RunError(f"{path} comes from another run (its run id is {carried.get('run_id')}, {config_path} says "
                       f"{own['run_id']}); put back this run's checkpoint, or delete it to train from scratch")
    differ = [f"{part}.{key} {carried[part].get(key)!r} in the checkpoint, {own[part].get(key)!r} in config.json"
              for part in ("model", "training") if part == "model" or "training" in meta
              for key in sorted(own[part].keys() | carried[part].keys())
              if own[part].get(key) != carried[part].get(key)]
    if own["fingerprints"] is not None and own["fingerprints"] != carried.get("fingerprints"):
        differ.append("the fingerprints of the tokenizer or the training data")
    if "source" in own and "source" in carried and own["source"] != carried["source"]:
        differ.append("where the data came from (\"source\")")     # compared where both record it
    if differ:
        raise RunError(f"{config_path} was edited: the weights in {path} do not fit it, they were trained with other "
                       f"settings ({'; '.join(differ[:3])}); undo the edit (or restore config.json) to use this run")


def apply_checkpoint(path: Path, checkpoint: dict, apply) -> None:
    """`apply(checkpoint)` (load weights, restore a trainer); RunError when it does not fit config.json."""
    try:
        apply(checkpoint)
    except (RuntimeError, KeyError, ValueError, TypeError) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        detail = (lines[1] if len(lines) > 1 else " ".join(lines))[:300]
        raise RunError(f"the weights in {path} do not fit {path.parent / CONFIG} ({detail}); the files "
                       "come from different runs: keep the files of one run together") from None


def build_model(run: Path, config, device):
    """The model config.json describes, on `device`; RunError naming config.json when it cannot be built."""
    import torch

    from transformer_lib.model import build_transformer
    try:
        if str(device) == "meta":               # only checked: no memory is allocated
            with torch.device("meta"):
                return build_transformer(config)
        return build_transformer(config).to(device)
    except (ValueError, TypeError) as error:
        raise RunError(f"{run / CONFIG}: {one_line(error)}; the file was edited or damaged: undo the edit or "
                       "restore it from the run that wrote it") from None


# --- progress --------------------------------------------------------------------------------------

def finished_reason(state: dict, max_steps: int | None, time_budget_s: float | None) -> str | None:
    """Why a run at `state` (a checkpoint's "state") has nothing left to do under these stop
    conditions (the Trainer's: either one reached), or None while it has."""
    if max_steps is not None and state["step"] >= max_steps:
        return (f"it has trained {state['step']} steps" + (f", more than --max-steps {max_steps}"
                                                            if state["step"] > max_steps else " (--max-steps)"))
    if time_budget_s is not None and state.get("elapsed", 0.0) >= time_budget_s:
        return f"it has trained {state.get('elapsed', 0.0):.0f} s, the --time-budget of {time_budget_s:g} s"
    return None


def summary(state: dict, parameters: int, processes: int, accumulate: int) -> dict:
    """What `train` reports (and history.json holds) for a run at `state` (a checkpoint's "state")."""
    return {"steps": state["step"], "epochs_started": state.get("epoch", 0) + 1,
            "train_seconds": round(state.get("elapsed", 0.0), 1), "parameters": parameters,
            "processes": processes, "accumulate": accumulate, "history": state.get("history", [])}


class RunFolder:
    """A run folder on disk. `RunFolder(path)` reads nothing; `read()` reads and cross-checks its
    files (config.json, tokenizer.json, and checkpoint.pt if present); `load_model(device)` gives
    the trained model; `lock()` makes this process its one writer; `start`, `save_checkpoint` and
    `finish` write it, in an order that never leaves history.json behind the checkpoint."""

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"a run folder is a path (str or pathlib.Path), got {type(path).__name__}")
        self.path = Path(path)
        self.meta = self.config = self.tokenizer = self.checkpoint = None

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def exists(self) -> bool:
        """Whether a run was begun here (config.json is written last when a run starts)."""
        return (self.path / CONFIG).is_file()

    def read(self, device="cpu", need_checkpoint: bool = True) -> "RunFolder":
        """Read and check config.json, tokenizer.json and (if present, or if `need_checkpoint`)
        checkpoint.pt, and that they belong together; RunError naming the file that does not."""
        if need_checkpoint:
            check_readable_run(self.path)
        self.meta, self.config = read_config(self.path)
        build_model(self.path, self.config, "meta")        # a config.json that builds no model is named first
        self.tokenizer = load_tokenizer(self.path, self.meta, self.config)
        if (self.path / CHECKPOINT).exists():
            if not (self.path / CHECKPOINT).is_file():
                check_readable_run(self.path)
            self.checkpoint = read_checkpoint(self.path, device)
            check_identity(self.path, self.meta, self.checkpoint)
        return self

    def load_model(self, device):
        """The trained model, in eval mode, on `device` (after `read`)."""
        from transformer_lib.training import load_weights
        model = build_model(self.path, self.config, device)
        apply_checkpoint(self.path / CHECKPOINT, self.checkpoint, lambda c: load_weights(model, c["model"]))
        return model.eval()

    @contextlib.contextmanager
    def lock(self):
        """This process is the folder's one writer while the context lasts; what a killed writer
        left half-written (*.tmp) is removed, since nobody else writes here now."""
        with TrainLock(self.path) as lock:
            for name in RUN_FILES:
                (self.path / (name + ".tmp")).unlink(missing_ok=True)
            yield lock

    def start(self, meta: dict, tokenizer=None) -> None:
        """Begin (with `tokenizer`) or update the run: tokenizer.json first, then config.json, whose
        presence says that a run lives here."""
        if tokenizer is not None:
            write_atomic(self.path / TOKENIZER, lambda p: tokenizer.save(p))
        try:
            write_json(self.path / CONFIG, meta)
        except BaseException:
            if tokenizer is not None:       # a new run that did not begin leaves no tokenizer behind
                (self.path / TOKENIZER).unlink(missing_ok=True)
            raise
        self.meta = meta

    def save_checkpoint(self, payload: dict, history: dict | None = None) -> None:
        """Replace checkpoint.pt with `payload` (with `history`, the summary of a finished train, write
        history.json after it; without, first remove a history.json of an earlier step). RunError
        naming the file when the disk refuses it (full, read-only), and what was lost."""
        from transformer_lib.training import save_checkpoint
        path = self.path / CHECKPOINT
        try:
            if history is None:
                (self.path / HISTORY).unlink(missing_ok=True)
            save_checkpoint(path, payload)
            if self.meta is not None and self.meta.get("format", 1) < FORMAT:     # an older run, now with identity
                self.start({**self.meta, "format": FORMAT})
            if history is not None:
                write_json(self.path / HISTORY, history)
        except (OSError, RuntimeError) as error:
            if isinstance(error, RuntimeError) and "inline_container" not in str(error) \
                    and "write" not in str(error).lower():
                raise
            step = payload["state"]["step"]
            raise RunError(f"cannot write {path} at step {step} ({one_line(error)[:160]}): is the disk full or the "
                           f"folder read-only? The steps since the last checkpoint are lost; free space or make "
                           f"{self.path} writable, then resume with the same command") from None
