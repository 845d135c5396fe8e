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
import json
import os
from pathlib import Path

from transformer_lib.run_config import (AMP_DTYPES, CONFIG, DEFAULT_LANGS, FORMAT, OPTION_OF_FIELD,  # noqa: F401
                                        RunError, check_same_data, check_same_run, new_config, one_line, read_config)
from transformer_lib.files import (fingerprint_bytes, fingerprint_pairs, fingerprint_tokenizer,  # noqa: F401
                                   write_atomic, write_atomic_in, write_json)
from transformer_lib.run_lock import LOCK, TrainLock, lock_holder  # noqa: F401
from transformer_lib.run_paths import (CHECKPOINT, HISTORY, RUN_FILES, TOKENIZER, check_new_run_folder,  # noqa: F401
                                       check_not_a_run_file, check_output_file, check_path_text, check_readable_run,
                                       check_writable, unreplaceable)
from transformer_lib.settings import CHANGEABLE_ON_RESUME, CORPORA, SEED_LIMIT  # noqa: F401


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
    located = lambda source: {k: v for k, v in source.items() if k not in ("train", "valid", "test", "data_dir")}  # noqa
    if "source" in own and "source" in carried and located(own["source"]) != located(carried["source"]):
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
    `write_history` write it, only under the lock, through the open folder (a folder moved while it
    trains is written where it now is), in an order that never leaves history.json behind the checkpoint."""

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"a run folder is a path (str or pathlib.Path), got {type(path).__name__}")
        self.path = Path(path)
        self.meta = self.config = self.tokenizer = self.checkpoint = None
        self._lock = None

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

    # --- writing: only under the lock, through the open folder ------------------------------------------

    @contextlib.contextmanager
    def lock(self):
        """This process is the folder's one writer while the context lasts; what a killed writer
        left half-written (*.tmp) is removed, since nobody else writes here now."""
        with TrainLock(self.path) as lock:
            self._lock = lock
            try:
                for name in RUN_FILES:
                    self._remove(name + ".tmp")
                yield lock
            finally:
                self._lock = None

    def location(self) -> Path:
        """Where the folder is now: its path, or where it was moved to while this process held it."""
        fd = self._lock.fd if self._lock is not None else None
        if fd is None or os.name == "nt" or not os.path.isdir(f"/proc/self/fd/{fd}"):
            return self.path
        now = os.readlink(f"/proc/self/fd/{fd}")
        try:
            if os.path.samefile(now, self.path):
                return self.path
        except OSError:
            pass
        return Path(now)

    def _require_lock(self, method: str) -> None:
        if self._lock is None:
            raise RunError(f"RunFolder.{method} writes {self.path}, so it needs the folder's lock: call it inside "
                           "`with folder.lock():` (one writer at a time)")

    def _write(self, name: str, write) -> None:
        """`write(binary file)` into the file `name` of the folder, whole (see `files.write_atomic_in`)."""
        fd = self._lock.fd if os.name != "nt" else None
        write_atomic_in(fd, name if fd is not None else self.path / name, write)

    def _remove(self, name: str) -> None:
        try:
            if self._lock is not None and os.name != "nt":
                os.unlink(name, dir_fd=self._lock.fd)
            else:
                (self.path / name).unlink()
        except FileNotFoundError:
            pass

    def _write_json(self, name: str, value) -> None:
        text = json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)
        self._write(name, lambda f: f.write(text.encode("utf-8")))

    def start(self, meta: dict, tokenizer=None) -> None:
        """Begin (with `tokenizer`) or update the run: tokenizer.json first, then config.json, whose
        presence says that a run lives here. RunError naming the file the disk refuses."""
        self._require_lock("start")
        name = TOKENIZER
        try:
            if tokenizer is not None:
                text = tokenizer.tokenizer.to_str(pretty=True)
                self._write(TOKENIZER, lambda f: f.write(text.encode("utf-8")))
            name = CONFIG
            self._write_json(CONFIG, meta)
        except OSError as error:
            if tokenizer is not None:       # a new run that did not begin leaves no tokenizer behind
                self._remove(TOKENIZER)
            raise RunError(f"cannot write {self.location() / name} ({error.strerror or one_line(error)}): is the "
                           f"disk full or the folder read-only? " + (
                               "No run was begun, so nothing is lost; free space or make it writable, then run "
                               "the same command again" if tokenizer is not None else
                               f"{CONFIG} is as it was; free space or make it writable, then run the same command "
                               "again")) from None
        self.meta = meta

    def save_checkpoint(self, payload: dict, history: dict | None = None, saved_step: int | None = None) -> None:
        """Replace checkpoint.pt with `payload`, after removing history.json, which must never be behind
        it; with `history` (the summary of a finished train), write history.json after it. RunError naming
        the file the disk refuses (full, read-only) and what is kept: `saved_step` is the step of the
        checkpoint there was (None: none)."""
        import torch
        self._require_lock("save_checkpoint")
        step, where = payload["state"]["step"], self.location()
        kept = (f"{where / CHECKPOINT} still holds step {saved_step}, so the {step - saved_step} steps since are lost"
                if saved_step is not None else f"no checkpoint was saved yet, so these {step} steps are lost")
        fix = f"free space or make {where} writable, then resume with the same command"
        try:
            self._remove(HISTORY)
        except OSError as error:
            raise RunError(f"cannot remove {where / HISTORY} before saving step {step} "
                           f"({error.strerror or one_line(error)}): {kept}; {fix}") from None
        try:
            self._write(CHECKPOINT, lambda f: torch.save(payload, f))
            if self.meta is not None and self.meta.get("format", 1) < FORMAT:     # an older run, now with identity
                self.start({**self.meta, "format": FORMAT})
        except (OSError, RuntimeError) as error:
            if isinstance(error, RuntimeError) and "inline_container" not in str(error) \
                    and "write" not in str(error).lower():
                raise
            gone = "" if os.path.isdir(where) else " (the run folder was deleted while it trained)"
            raise RunError(f"cannot write {where / CHECKPOINT} at step {step}{gone} ({one_line(error)[:160]}): is the "
                           f"disk full or the folder read-only? {kept}; {fix}") from None
        if history is not None:
            self.write_history(history)

    def write_history(self, history: dict) -> None:
        """history.json, the summary of the checkpoint's step; RunError naming it (the checkpoint is kept)."""
        self._require_lock("write_history")
        try:
            self._write_json(HISTORY, history)
        except OSError as error:
            where = self.location()
            raise RunError(f"cannot write {where / HISTORY} at step {history['steps']} "
                           f"({error.strerror or one_line(error)}): {where / CHECKPOINT} holds step "
                           f"{history['steps']}, so no training is lost; free space or make {where} writable, then "
                           "run the same command, which writes it") from None

    def history_matches(self, step: int) -> bool:
        """Whether history.json is there, readable, and of the checkpoint's `step`."""
        try:
            return json.loads((self.path / HISTORY).read_text(encoding="utf-8")).get("steps") == step
        except (OSError, ValueError, AttributeError):
            return False

    def check_room(self, model, copies: int = 0) -> None:
        """Before the first step: RunError when a checkpoint of `model` cannot be written here: a run file
        made immutable or append-only, or too little free space for a checkpoint (the weights, Adam's two
        moments and `copies` more, e.g. --average's snapshots; the old checkpoint stays until the new one is whole)."""
        self._require_lock("check_room")
        fd, where = self._lock.fd, self.location()
        for name in RUN_FILES[:4]:
            if unreplaceable(where / name):
                raise RunError(f"{where / name} is immutable or append-only (`lsattr` shows it), so it cannot be "
                               f"replaced and training would be lost at the first save; clear it (`chattr -i -a "
                               f"{where / name}`) or train into a new --run folder")
        if fd is None or not hasattr(os, "fstatvfs"):
            return
        need = sum(p.numel() * p.element_size() for p in model.parameters()) * (3 + copies) + (1 << 20)
        info = os.fstatvfs(fd)
        free = info.f_bavail * info.f_frsize
        if free < need:
            raise RunError(f"{where} has {free / 1e6:.1f} MB free on its disk, but a checkpoint of this model takes "
                           f"about {need / 1e6:.1f} MB (its weights, the optimizer's two moments"
                           f"{', the snapshots --average keeps' if copies else ''}); free space, "
                           "or give a --run folder on another disk")

