"""The settings of a training run: one dataclass, built once and handed to `train_run.train_run`.

Hand-written, not exported: the command line (`cli.py` maps each option to one field), the course
model (`course.COURSE_MODEL`, which notebook 11 trains), the notebooks and the benchmark scripts all
build a `TrainSettings`, so no one notebook is its home. Each field's default and help text live
here and only here: `train --help` prints them from these fields.

Which settings a run records, compares on resume, or lets change on resume is said here too
(`RECORDED`, `CHANGEABLE_ON_RESUME`); `runs.RunFolder` applies those rules.
"""
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

CORPORA = ("builtin", "multi30k", "opus_books")
AMP_CHOICES = ("auto", "bf16", "fp16", "none")
INT_LIMIT = 2 ** 31 - 1      # the largest count or size a setting takes (no run needs more)
SEED_LIMIT = 2 ** 32         # seeds are in [0, SEED_LIMIT)
LOG_EVERY = 10               # steps between the mean losses logged in history.json
COMPILE_PAD_TO_MULTIPLE = 8  # `compile=True` pads S and T of each batch to a multiple of this
# `amp="auto"` on a CPU with bf16 instructions times 32 training steps (`device.faster_cpu_autocast`):
# done only for runs of at least this many steps (or with a time budget).
AMP_MEASURE_MIN_STEPS = 1000


def _rule(kind: type, ok, wanted: str, optional: bool = False) -> dict:
    return {"kind": kind, "ok": ok, "wanted": wanted, "optional": optional}


POSITIVE = _rule(int, lambda v: 0 < v <= INT_LIMIT, f"a positive integer (at most {INT_LIMIT})")
NONNEGATIVE = _rule(int, lambda v: 0 <= v <= INT_LIMIT, f"an integer >= 0 (at most {INT_LIMIT})")
PROBABILITY = _rule(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
POSITIVE_FLOAT = _rule(float, lambda v: v > 0, "a finite number > 0")


def _setting(default, option: str, help: str, rule: dict | None = None, shown: str | None = None, **extra):
    """A field with its command-line option, help text, check, and how --help shows its default."""
    metadata = {"option": option, "help": help, "rule": rule, "shown": shown, **extra}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TrainSettings:
    """Everything that decides a training run, with the defaults of `python -m transformer_lib train`.
    ValueError/TypeError at construction for a value of the wrong type or range, naming the field."""
    # --- data (issue: a data source becomes one more field here) ---
    data: str = _setting("builtin", "--data", "corpus", choices=CORPORA)
    data_dir: Path | None = _setting(None, "--data-dir", "multi30k only: local folder of its files",
                                     shown="$MULTI30K_DIR, else the Hub", path=True)
    src_lang: str | None = _setting(None, "--src-lang", "multi30k, opus_books: source language",
                                    shown="de for multi30k, en for opus_books")
    tgt_lang: str | None = _setting(None, "--tgt-lang", "multi30k, opus_books: target language",
                                    shown="en for multi30k, it for opus_books")
    vocab_size: int = _setting(1000, "--vocab-size", "shared BPE vocabulary size", POSITIVE)
    # --- model ---
    d_model: int = _setting(128, "--d-model", "model width", POSITIVE)
    heads: int = _setting(4, "--heads", "attention heads", POSITIVE)
    d_ff: int = _setting(512, "--d-ff", "feed-forward hidden width", POSITIVE)
    layers: int = _setting(2, "--layers", "encoder layers and decoder layers (each)", POSITIVE)
    dropout: float = _setting(0.1, "--dropout", "dropout probability", PROBABILITY)
    attention_dropout: float | None = _setting(None, "--attention-dropout",
                                               "dropout on attention weights (0 = the paper)", PROBABILITY,
                                               shown="--dropout")
    activation_dropout: float | None = _setting(None, "--activation-dropout",
                                                "dropout on feed-forward hidden units (0 = the paper)", PROBABILITY,
                                                shown="--dropout")
    post_ln: bool = _setting(False, "--post-ln", "post-LN as in the paper instead of pre-LN", flag=True, shown="pre-LN")
    max_len: int = _setting(512, "--max-len", "longest sequence in tokens; longer training pairs are dropped",
                            _rule(int, lambda v: 2 <= v <= INT_LIMIT, "an integer >= 2 (<s> and </s> included)"))
    # --- loss, batches, schedule ---
    label_smoothing: float = _setting(0.1, "--label-smoothing", "label smoothing ε", PROBABILITY)
    max_tokens: int = _setting(4096, "--max-tokens", "padded tokens per batch", POSITIVE)
    accumulate: int = _setting(1, "--accumulate",
                               "batches per update (gradient accumulation): their mean gradient, as N processes give",
                               POSITIVE)
    warmup: int = _setting(400, "--warmup", "warmup steps of the inverse-sqrt schedule", POSITIVE)
    lr_factor: float = _setting(1.0, "--lr-factor", "multiplies the paper's learning rate", POSITIVE_FLOAT)
    cooldown: float = _setting(0.0, "--cooldown", "share of the run (of --max-steps or --time-budget) over which "
                               "the rate falls linearly to 0", PROBABILITY)
    pad_to_multiple: int | None = _setting(None, "--pad-to-multiple",
                                           "pad each batch's lengths to a multiple of this; it decides which "
                                           "sentences share a batch, so a run resumes only with the value it "
                                           "began with",
                                           POSITIVE, shown=f"{COMPILE_PAD_TO_MULTIPLE} with --compile, else 1")
    seed: int = _setting(0, "--seed", "random seed (data order, init, dropout)",
                         _rule(int, lambda v: 0 <= v < SEED_LIMIT, f"an integer in [0, {SEED_LIMIT - 1}]"))
    # --- when to stop, validate, save ---
    max_steps: int | None = _setting(None, "--max-steps", "stop after this many steps", NONNEGATIVE, shown="none")
    time_budget: float | None = _setting(None, "--time-budget", "stop after this much training time (90s, 25m, 1.5h)",
                                         POSITIVE_FLOAT, shown="none", duration=True)
    validate_every: int = _setting(50, "--validate-every", f"steps between validation losses (a multiple of "
                                   f"{LOG_EVERY}; 0 = never; corpora with a valid split)",
                                   _rule(int, lambda v: 0 <= v <= INT_LIMIT and v % LOG_EVERY == 0,
                                         f"an integer >= 0 and a multiple of {LOG_EVERY} (the steps between "
                                         "logged losses; 0 = never)"))
    checkpoint_every: int = _setting(100, "--checkpoint-every", "steps between checkpoints", POSITIVE)
    # --- where and how fast (not recorded: a run may resume elsewhere) ---
    device: str | None = _setting(None, "--device", "cuda, cuda:N, mps or cpu", shown="the best present")
    amp: str = _setting("auto", "--amp", "mixed precision. auto: what the run folder records, else what pays here: "
                        "bf16 on CUDA capability >= 8.0, fp16 below, on a CPU bf16 only with bf16 instructions and "
                        f"measured faster (runs of >= {AMP_MEASURE_MIN_STEPS} steps), else float32. bf16: CUDA or a "
                        "CPU; fp16: CUDA; none: float32", choices=AMP_CHOICES)
    threads: int | None = _setting(None, "--threads", "CPU threads for torch",
                                   _rule(int, lambda v: 0 < v <= 1024, "an integer in [1, 1024]"),
                                   shown="torch's choice")
    compile: bool = _setting(False, "--compile", "torch.compile the model (minutes up front; pays on GPUs)", flag=True,
                             shown="off")
    progress: bool = _setting(True, "--no-progress", "hide the progress bar", flag=True, inverted=True, shown="shown")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _check_field(f, getattr(self, f.name))
        if self.data_dir is not None and not isinstance(self.data_dir, Path):
            object.__setattr__(self, "data_dir", Path(self.data_dir))

    @property
    def batch_multiple(self) -> int:
        """The multiple batches are padded to: `pad_to_multiple`, else 8 with `compile` (few shapes,
        so few recompilations), else 1."""
        if self.pad_to_multiple is not None:
            return self.pad_to_multiple
        return COMPILE_PAD_TO_MULTIPLE if self.compile else 1

    def recorded(self) -> dict:
        """The settings a run records in its config.json "training" and compares on resume (besides
        the model, the data and the batches, which config.json records apart)."""
        return {"seed": self.seed, "max_tokens": self.max_tokens, "warmup": self.warmup, "lr_factor": self.lr_factor,
                "label_smoothing": self.label_smoothing, "cooldown": self.cooldown}


# A resumed run may change these, and says so: the message of a non-finite loss recommends them.
CHANGEABLE_ON_RESUME = ("warmup", "lr_factor", "cooldown")


def option_of(name: str) -> str:
    """The command-line option of a field, for messages."""
    return TrainSettings.__dataclass_fields__[name].metadata["option"]


def _check_field(f: dataclasses.Field, value) -> None:
    meta, where = f.metadata, f"{f.name} ({f.metadata['option']})"
    if value is None and f.default is None:
        return
    if meta.get("flag"):
        if not isinstance(value, bool):
            raise TypeError(f"{where} must be True or False, got {value!r}")
        return
    if "choices" in meta:
        if value not in meta["choices"]:
            raise ValueError(f"{where} must be one of {', '.join(meta['choices'])}, got {value!r}")
        return
    if meta.get("path"):
        if not isinstance(value, (str, Path)) or not str(value).strip():
            raise TypeError(f"{where} must be a folder path, got {value!r}")
        return
    rule = meta.get("rule")
    if rule is None:            # free text (languages, device: checked where they are used)
        if not isinstance(value, str) or not value.strip():
            raise TypeError(f"{where} must be a non-empty string or None, got {value!r}")
        return
    numeric = (int,) if rule["kind"] is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, numeric):
        raise TypeError(f"{where} must be {rule['wanted']}, got {value!r}")
    if not (math.isfinite(value) and rule["ok"](value)):
        raise ValueError(f"{where} must be {rule['wanted']}, got {value!r}")
