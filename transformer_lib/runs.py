"""The run folder: the one place that knows its files and what they mean.

Hand-written, not exported: the command line (`cli.py`), `course_model` and the notebooks that
load the course model all use it, so no one notebook is its home. A run folder holds

    config.json     what the run is: the model configuration, the data, the training settings that
                    decide its updates, the precision it began in ("amp"), and fingerprints (SHA-256)
                    of its tokenizer and training pairs
    tokenizer.json  the BPE tokenizer the model was trained with
    checkpoint.pt   everything to resume training (`Trainer.checkpoint()`), the trained weights
    history.json    the summary and logged losses of the last `train` that ran to its end
    train.lock      only while a `train` runs: the process id of the one that may write the folder

Every file is written atomically (a temporary file renamed onto it), so a reader sees the old file
or the new one. A problem the user can fix raises `RunError` with a message that names the file
or option and says what to do; the command line prints it as one `error:` line.

Runs written before config.json had a "format" (format 1) hold no fingerprints and no training
settings: they are still read, with the older check (the tokenizer's size and padding id against
config.json), and `train` records both when it resumes one.
"""
import dataclasses
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

FORMAT = 2
CONFIG, TOKENIZER, CHECKPOINT, HISTORY, LOCK = "config.json", "tokenizer.json", "checkpoint.pt", "history.json", "train.lock"
CORPORA = ("builtin", "multi30k", "opus_books")
AMP_DTYPES = ("bf16", "fp16", "float32")     # the precision a run began in (`train --amp` resolved)
# The option that sets each recorded setting, for messages.
OPTION_OF_FIELD = {"d_model": "--d-model", "n_heads": "--heads", "d_ff": "--d-ff", "n_encoder_layers": "--layers",
                   "n_decoder_layers": "--layers", "dropout": "--dropout", "norm_first": "--post-ln",
                   "max_len": "--max-len", "src_vocab_size": "--vocab-size", "tgt_vocab_size": "--vocab-size",
                   "vocab_size": "--vocab-size", "data": "--data", "src_lang": "--src-lang", "tgt_lang": "--tgt-lang",
                   "attention_dropout": "--attention-dropout", "activation_dropout": "--activation-dropout",
                   "seed": "--seed", "max_tokens": "--max-tokens", "warmup": "--warmup", "lr_factor": "--lr-factor",
                   "label_smoothing": "--label-smoothing",
                   "pad_to_multiple": "--pad-to-multiple, or --compile, which pads batches to a multiple of 8 and so makes other batches"}
# Corpus languages when --src-lang/--tgt-lang are left out (as in load_pairs), so "de" and None compare equal.
DEFAULT_LANGS = {"builtin": (None, None), "multi30k": ("de", "en"), "opus_books": ("en", "it")}
SEED_LIMIT = 2 ** 32          # seeds are in [0, SEED_LIMIT)


class RunError(Exception):
    """A problem with the arguments or the run folder that the user can fix; the CLI prints it as one line."""


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


# --- the folder ------------------------------------------------------------------------------------

def _nearest_existing(path: Path) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            return folder
    return Path.cwd()


def check_writable(path: Path, option: str, folder: bool) -> None:
    """RunError unless this process can create or replace `path` (a folder if `folder`, else a
    file): nothing in the way is a file (or, for a file, a folder), and the nearest existing folder
    accepts a new file, tried by writing and removing one there (os.access misjudges root and ACLs)."""
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


def check_readable_run(run: Path) -> None:
    """RunError unless `run` is a folder holding a run's config.json and checkpoint.pt."""
    if run.exists() and not run.is_dir():
        raise RunError(f"--run {run} is a file, not a run folder; give the folder that `train` wrote")
    for name in (CHECKPOINT, CONFIG):
        if not (run / name).is_file():
            holder = lock_holder(run)
            raise RunError(f"{run / name} is missing: " + (
                f"a train (pid {holder}) is writing {run} and has saved no checkpoint yet; wait for its first one"
                if holder else f"train first: python -m transformer_lib train --run {run} ..."))


def check_not_a_run_file(path: Path, option: str) -> None:
    """RunError when `path` (an output file) is one of the files of the run folder it lies in."""
    if path.name in (CONFIG, TOKENIZER, CHECKPOINT, HISTORY, LOCK) and (path.parent / CONFIG).is_file():
        raise RunError(f"{option} {path} would overwrite the {path.name} of the run in {path.parent}; "
                       "write the output to another file")


def check_new_run_folder(run: Path) -> None:
    """A folder without config.json gets a new run only if it holds nothing but hidden files and the
    leftovers of a `train` stopped before it began (tokenizer.json, *.tmp): a run is never written
    over other files, nor over a checkpoint whose config.json is lost."""
    if run.is_dir():
        others = sorted(p.name for p in run.iterdir() if not (p.name.startswith(".") or p.name in (LOCK, TOKENIZER)
                                                              or p.name.endswith(".tmp")))
        if others:
            raise RunError(f"--run {run} is not a run folder (no {CONFIG}) and is not empty (it holds "
                           f"{', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); train into a new or "
                           "empty folder, or delete what is left of a damaged run")


def write_atomic(path: Path, write) -> None:
    """`write(temporary path)`, flushed to disk, then renamed onto `path`: readers see the old file
    or the new one, never half of one (and no temporary file is left on error)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, value) -> None:
    write_atomic(path, lambda p: p.write_text(json.dumps(value, indent=1, ensure_ascii=False), encoding="utf-8"))


# --- fingerprints ----------------------------------------------------------------------------------

def fingerprint_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fingerprint_pairs(pairs: list[tuple[str, str]]) -> dict:
    """SHA-256 of (source, target) pairs in order, and their count: equal for the same training data."""
    digest = hashlib.sha256()
    for src, tgt in pairs:
        digest.update(src.encode("utf-8", "surrogatepass") + b"\0" + tgt.encode("utf-8", "surrogatepass") + b"\n")
    return {"sha256": digest.hexdigest(), "count": len(pairs)}


def save_tokenizer(run: Path, tokenizer) -> str:
    """Write the tokenizer (atomically) and return the fingerprint of the bytes written."""
    written = {}

    def write(tmp: Path) -> None:
        tokenizer.save(tmp)
        written["fingerprint"] = fingerprint_bytes(tmp.read_bytes())
    write_atomic(run / TOKENIZER, write)
    return written["fingerprint"]


# --- config.json -----------------------------------------------------------------------------------

def _int(low: int, high: int | None = None):
    return (lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= low and (high is None or v < high),
            f"an integer >= {low}" + (f" and < {high}" if high else ""))


def _number(low: float, high: float | None = None, open_low: bool = False):
    def ok(v):
        return (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
                and (v > low if open_low else v >= low) and (high is None or v < high))
    return ok, f"a number {'>' if open_low else '>='} {low}" + (f" and < {high}" if high is not None else "")


_OPTIONAL_TEXT = (lambda v: v is None or (isinstance(v, str) and v.strip() != ""), "null or a non-empty string")
_TOP_LEVEL = {"data": (lambda v: v in CORPORA, f"one of {', '.join(CORPORA)}"),
              "src_lang": _OPTIONAL_TEXT, "tgt_lang": _OPTIONAL_TEXT, "data_dir": _OPTIONAL_TEXT,
              "vocab_size": (lambda v: v is None or _int(1)[0](v), "null or an integer >= 1"),
              "processes": _int(1), "accumulate": _int(1), "pad_to_multiple": _int(1),
              "amp": (lambda v: v in AMP_DTYPES, f"one of {', '.join(AMP_DTYPES)}")}
_TRAINING = {"seed": _int(0, SEED_LIMIT), "max_tokens": _int(1), "warmup": _int(1),
             "lr_factor": _number(0, open_low=True), "label_smoothing": _number(0, 1)}


def _model_field_check(field: dataclasses.Field):
    """(check, description) for one TransformerConfig field, from its annotation and meaning."""
    if field.type is bool:
        return (lambda v: isinstance(v, bool)), "true or false"
    if field.name.endswith("dropout"):
        check, what = _number(0, 1)
        return ((check, what) if field.type is float else (lambda v: v is None or check(v), f"null or {what}"))
    if field.type is float:
        return _number(0, open_low=True)
    return _int(0) if field.name == "pad_id" else _int(2) if field.name == "max_len" else _int(1)


def _config_problem(meta) -> str | None:
    """What is wrong with the contents of a config.json, or None."""
    from transformer_lib.model import TransformerConfig
    if not isinstance(meta, dict):
        return f"it holds a JSON {type(meta).__name__}, not an object"
    if meta.get("format", 1) not in (1, FORMAT):
        return f"\"format\" is {meta['format']!r}: written by another version of transformer_lib, which reads it"
    required = ["model", "data"] + (["training", "fingerprints"] if "format" in meta else [])
    missing = [key for key in required if key not in meta]
    if missing:
        return f"it has no {', '.join(map(repr, missing))}"
    for key, (check, what) in _TOP_LEVEL.items():
        if key in meta and not check(meta[key]):
            return f"\"{key}\" is {meta[key]!r}, expected {what}"
    model = meta["model"]
    fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
    if not isinstance(model, dict):
        return f"\"model\" is {model!r}, expected an object of model settings"
    unknown, absent = sorted(set(model) - set(fields)), [n for n, f in fields.items()
                                                         if f.default is dataclasses.MISSING and n not in model]
    if unknown or absent:
        return f"\"model\" has {'unknown settings ' + str(unknown) if unknown else 'no ' + str(absent)}"
    for name, value in model.items():
        check, what = _model_field_check(fields[name])
        if not check(value):
            return f"\"model\".\"{name}\" is {value!r}, expected {what}"
    if "format" in meta:
        for key, table in (("training", _TRAINING),):
            if not isinstance(meta[key], dict) or set(meta[key]) != set(table):
                return f"\"{key}\" is {meta[key]!r}, expected an object with {', '.join(table)}"
            for name, (check, what) in table.items():
                if not check(meta[key][name]):
                    return f"\"{key}\".\"{name}\" is {meta[key][name]!r}, expected {what}"
        prints = meta["fingerprints"]
        if not (isinstance(prints, dict) and isinstance(prints.get("tokenizer"), str)
                and isinstance(prints.get("train_pairs"), dict)):
            return f"\"fingerprints\" is {prints!r}, expected an object with \"tokenizer\" and \"train_pairs\""
    return None


def read_config(run: Path):
    """(config.json as a dict, its TransformerConfig); RunError naming the file and the setting when
    it is missing, not JSON, or holds a value of the wrong type or range (e.g. edited by hand)."""
    from transformer_lib.model import TransformerConfig
    path = run / CONFIG
    if not path.is_file():
        raise RunError(f"{path} is missing; train first: python -m transformer_lib train --run {run} ...")
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise RunError(f"{path} is not valid JSON ({one_line(error)[:120]}); restore it from the run that wrote it, "
                       "or train into a new --run folder") from None
    problem = _config_problem(meta)
    if problem:
        raise RunError(f"{path}: {problem}; the file was edited or damaged: undo the edit or restore it from the "
                       "run that wrote it, or train into a new --run folder")
    return meta, TransformerConfig(**meta["model"])


def new_config(config, data: str, src_lang, tgt_lang, data_dir, vocab_size: int, processes: int, accumulate: int,
               training: dict, tokenizer_fingerprint: str, train_pairs: dict, pad_to_multiple: int = 1) -> dict:
    """The config.json of a run: what decides its model, tokenizer, data, batches and updates."""
    default_src, default_tgt = DEFAULT_LANGS[data]
    return {"format": FORMAT, "model": dataclasses.asdict(config), "data": data, "src_lang": src_lang or default_src,
            "tgt_lang": tgt_lang or default_tgt, "data_dir": None if data_dir is None else str(data_dir),
            "vocab_size": vocab_size, "processes": processes, "accumulate": accumulate, "training": dict(training),
            "pad_to_multiple": pad_to_multiple, "fingerprints": {"tokenizer": tokenizer_fingerprint,
                                                                 "train_pairs": train_pairs}}


def check_same_run(run: Path, old: dict, new: dict) -> None:
    """RunError naming every setting in which `new` differs from the existing run's config.json `old`
    (settings a format-1 run did not record are not compared)."""
    def settings(meta: dict) -> dict:
        src_lang, tgt_lang = DEFAULT_LANGS.get(meta.get("data"), (None, None))
        return {**meta.get("model", {}), "data": meta.get("data"), "src_lang": meta.get("src_lang") or src_lang,
                "tgt_lang": meta.get("tgt_lang") or tgt_lang, "vocab_size": meta.get("vocab_size"),
                "pad_to_multiple": meta.get("pad_to_multiple", 1), **meta.get("training", {})}
    was, now = settings(old), settings(new)
    for key in now:
        if key not in was or was[key] is None and key == "vocab_size":
            was[key] = now[key]      # not recorded by the version that wrote the run
    differ = [f"{key} {was.get(key)} -> {now.get(key)} ({OPTION_OF_FIELD.get(key, 'not an option')})"
              for key in sorted(was.keys() | now.keys()) if was.get(key) != now.get(key)]
    if differ:
        raise RunError(f"{run} was trained with another configuration, so it is left as it was: {'; '.join(differ)}. "
                       f"Resume it with its own settings (see {run / CONFIG}) or train into a new --run folder")
    was, now = (old.get("processes", 1), old.get("accumulate", 1)), (new["processes"], new["accumulate"])
    if was != now:
        raise RunError(f"{run} was trained with {was[0]} process(es) × --accumulate {was[1]}, this launch has "
                       f"{now[0]} × --accumulate {now[1]}, so it is left as it was; resume it with "
                       f"torchrun --nproc_per_node={was[0]} (or without torchrun for 1) and --accumulate {was[1]}, "
                       "or train into a new --run folder")


def check_same_data(run: Path, meta: dict, pairs_print: dict, where: str) -> None:
    """RunError when the training pairs differ from those the run recorded (format 2 only)."""
    recorded = meta.get("fingerprints", {}).get("train_pairs")
    if recorded is not None and recorded != pairs_print:
        raise RunError(f"the training pairs of {where} ({pairs_print['count']} pairs) are not those {run} was trained "
                       f"on ({recorded.get('count')} pairs; fingerprints in {run / CONFIG} differ), so it is left as "
                       "it was; resume it with its own data, or train into a new --run folder")


# --- tokenizer, checkpoint, model ------------------------------------------------------------------

def load_tokenizer(run: Path, meta: dict, config):
    """The run's tokenizer, checked against config.json: its fingerprint (format 2), else its size
    and padding id (format 1)."""
    from tokenizers import Tokenizer

    from transformer_lib.tokenization import SubwordTokenizer
    path = run / TOKENIZER
    if not path.is_file():
        raise RunError(f"{path} is missing; restore it from the run that wrote it, or train into a new --run folder")
    data = path.read_bytes()
    recorded = meta.get("fingerprints", {}).get("tokenizer")
    try:
        tokenizer = SubwordTokenizer(Tokenizer.from_str(data.decode("utf-8")))
    except Exception as error:   # the tokenizers library raises a bare Exception for a damaged file
        raise RunError(f"{path} is not a readable tokenizer ({one_line(error)[:160]}); restore it from the run "
                       "that wrote it, or train into a new --run folder") from None
    if recorded is not None and fingerprint_bytes(data) != recorded:
        raise RunError(f"{path} is not the tokenizer this run was trained with (its fingerprint differs from the one "
                       f"in {run / CONFIG}): it comes from another run; put back this run's {TOKENIZER}, or train "
                       "into a new --run folder")
    if (tokenizer.vocab_size, tokenizer.pad_id) != (config.src_vocab_size, config.pad_id) \
            or config.tgt_vocab_size != config.src_vocab_size:
        raise RunError(f"{path} ({tokenizer.vocab_size} tokens, padding id {tokenizer.pad_id}) and {run / CONFIG} "
                       f"(src_vocab_size={config.src_vocab_size}, tgt_vocab_size={config.tgt_vocab_size}, "
                       f"pad_id={config.pad_id}) disagree on the vocabulary: they come from different runs; "
                       "keep the files of one run together")
    return tokenizer


def read_checkpoint(run: Path, device="cpu") -> dict:
    """checkpoint.pt as a dict with "model" weights and a "state" with its step; RunError naming the
    file when it is empty, truncated or not a checkpoint at all."""
    import torch
    path = run / CHECKPOINT
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except Exception:    # EOFError, RuntimeError, UnpicklingError, ... from torch.load on a damaged file
        checkpoint = None
    state = checkpoint.get("state") if isinstance(checkpoint, dict) else None
    if not (isinstance(state, dict) and isinstance(state.get("step"), int) and isinstance(checkpoint.get("model"), dict)):
        raise RunError(f"{path} is empty, truncated or not a checkpoint of this library; restore it from a backup, "
                       "or delete it to train from scratch")
    return checkpoint


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
    from transformer_lib.model import build_transformer
    try:
        return build_transformer(config).to(device)
    except (ValueError, TypeError) as error:
        raise RunError(f"{run / CONFIG}: {one_line(error)}; the file was edited or damaged: undo the edit or "
                       "restore it from the run that wrote it") from None


def load_run(run: Path, device):
    """The trained model (in eval mode) and tokenizer of a run folder, after checking that its files
    exist, are intact and belong together."""
    from transformer_lib.training import load_weights
    run = Path(run)
    check_readable_run(run)
    meta, config = read_config(run)
    tokenizer = load_tokenizer(run, meta, config)
    model = build_model(run, config, device)
    checkpoint = read_checkpoint(run, device)
    apply_checkpoint(run / CHECKPOINT, checkpoint, lambda c: load_weights(model, c["model"]))
    return model.eval(), tokenizer


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


# --- one writer at a time --------------------------------------------------------------------------

def _try_lock(fd: int) -> bool:
    """Take an exclusive lock on the open file `fd` without waiting; the system releases it when the
    process ends, however it ends, so a lock left by a killed process is free again."""
    try:
        if os.name == "nt":
            import msvcrt
            os.lseek(fd, 1 << 20, os.SEEK_SET)       # a byte past the pid, which others must still read
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def lock_holder(run: Path) -> str | None:
    """The pid in the lock file of `run` if a live `train` holds that lock, else None."""
    try:
        fd = os.open(Path(run) / LOCK, os.O_RDWR if os.name == "nt" else os.O_RDONLY)   # flock needs no write
    except OSError:
        return None
    try:
        if _try_lock(fd):
            return None          # free (left by a process that ended); closing the file releases it
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
    finally:
        os.close(fd)


class TrainLock:
    """An exclusive lock on a run folder for one `train`: a second one is refused with the holder's
    pid. Creates the folder if needed; on exit removes the lock file, and the folders it created if
    they are still empty (a refused train leaves nothing behind)."""

    def __init__(self, run: Path):
        self.run, self.path, self.fd, self.created = Path(run), Path(run) / LOCK, None, []

    def __enter__(self) -> "TrainLock":
        for folder in reversed([self.run, *self.run.parents]):
            if not folder.exists():
                folder.mkdir()
                self.created.append(folder)
        try:
            while True:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                if not _try_lock(fd):
                    os.lseek(fd, 0, os.SEEK_SET)
                    holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
                    os.close(fd)
                    raise RunError(f"another train (pid {holder}) is writing {self.run}, so it is left to that one; "
                                   "wait for it to end (or stop it), or train into another --run folder")
                try:        # the previous holder may have removed the file between our open and lock
                    same = os.path.samestat(os.fstat(fd), os.stat(self.path))
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, str(os.getpid()).encode("ascii"))
            self.fd = fd
        except BaseException:
            self._remove_created()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            if os.name != "nt":
                self.path.unlink(missing_ok=True)     # before unlocking: a waiter then sees a new file
            os.close(self.fd)
            if os.name == "nt":
                try:
                    self.path.unlink(missing_ok=True)
                except OSError:
                    pass
            self.fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in reversed(self.created):
            try:
                folder.rmdir()      # only if empty: a run that wrote files keeps them
            except OSError:
                break
        self.created = []
