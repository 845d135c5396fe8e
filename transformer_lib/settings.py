"""The settings of a training run: one dataclass, built once and handed to `train_run.train_run`.

Hand-written, not exported: the command line (`cli.py` maps each option but `--run` to one field), the course
model (`course.COURSE_MODEL`, which notebook 11 trains), the notebooks and the benchmark scripts all
build a `TrainSettings`, so no one notebook is its home. Each field's default and help text live
here and only here: `train --help` prints them from these fields.

Which settings a run records, compares on resume, or lets change on resume is said here too
(`RECORDED`, `CHANGEABLE_ON_RESUME`); `runs.RunFolder` applies those rules.
"""
import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

CORPORA = ("builtin", "multi30k", "opus_books")     # the named corpora; DATA_KINDS = sources.KINDS
DATA_KINDS = CORPORA + ("files", "tsv", "csv", "hub")
# The fields that describe the data source (with `data`), and the DataSource field each one fills.
SOURCE_FIELDS = {"data_dir": "data_dir", "src_lang": "src_lang", "tgt_lang": "tgt_lang", "valid": "valid",
                 "test": "test", "valid_fraction": "valid_fraction", "test_fraction": "test_fraction",
                 "split_seed": "seed", "src_column": "src_column", "tgt_column": "tgt_column", "header": "header",
                 "delimiter": "delimiter"}
AMP_CHOICES = ("auto", "bf16", "fp16", "none")
INIT_CHOICES = ("ours", "torch")                    # --init: how the attention projections are drawn
ATTENTION_CHOICES = ("fused", "explicit", "auto")   # --attention: the path training takes
# --delimiter by name: a tab is hard to type on a command line.
DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "pipe": "|", "space": " "}
TEST_FRACTION = 0.05         # --test-fraction when --valid is not given
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
    # --- data: where the pairs come from (`sources.DataSource`, built from these fields once) ---
    data: "str | DataSource" = _setting("builtin", "--data", "where the pairs come from: builtin, multi30k, "
                                        "opus_books, files:SRC,TGT (or files:PREFIX with --src-lang/--tgt-lang: "
                                        "PREFIX.de, PREFIX.en), tsv:FILE, csv:FILE, hub:NAME or hub:NAME:CONFIG (a "
                                        "Hugging Face dataset, or a local folder it reads)", source=True)
    data_dir: Path | None = _setting(None, "--data-dir", "multi30k only: local folder of its files",
                                     shown="$MULTI30K_DIR, else the Hub", path=True)
    src_lang: str | None = _setting(None, "--src-lang", "source language (multi30k, opus_books, hub; files:PREFIX: "
                                    "the source file's suffix; others: recorded only)",
                                    shown="de for multi30k, en for opus_books")
    tgt_lang: str | None = _setting(None, "--tgt-lang", "target language, as --src-lang",
                                    shown="en for multi30k, it for opus_books")
    valid: str | None = _setting(None, "--valid", "validation pairs of files, tsv, csv or hub data, written as what "
                                 "follows --data's colon (SRC,TGT or PREFIX; a file; a Hub split name)",
                                 shown="carved out of the training pairs")
    test: str | None = _setting(None, "--test", "test pairs, written as --valid (`evaluate` scores them)",
                                shown="carved out of the training pairs")
    valid_fraction: float = _setting(0.05, "--valid-fraction", "share of the training pairs carved out for "
                                     "validation when --valid is not given (files, tsv, csv, hub, opus_books)",
                                     PROBABILITY)
    test_fraction: float | None = _setting(None, "--test-fraction", "the same for the test pairs (--test); none are "
                                           "carved when --valid is given: you have your own test pairs then, and "
                                           "score them with `evaluate --data`", PROBABILITY,
                                           shown="0.05, or 0 with --valid")
    split_seed: int = _setting(0, "--split-seed", "chooses the carved pairs: the same seed and pairs give the same "
                               "splits on any machine", _rule(int, lambda v: 0 <= v <= INT_LIMIT,
                                                              f"an integer >= 0 (at most {INT_LIMIT})"))
    src_column: str | int | None = _setting(None, "--src-column", "tsv, csv: the source column, an index from 0 or "
                                            "a header name; hub: a column name", shown="0; hub: the 'translation' "
                                            "column", column=True)
    tgt_column: str | int | None = _setting(None, "--tgt-column", "the target column, as --src-column",
                                            shown="1; hub: the 'translation' column", column=True)
    header: bool = _setting(False, "--header", "tsv, csv: the first row names the columns", flag=True,
                            shown="no header")
    delimiter: str | None = _setting(None, "--delimiter", "csv: the field separator, one character, or tab, "
                                     "comma, semicolon, pipe (a tab also as $'\\t' or \\t)", shown="\",\"",
                                     delimiter=True)
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
    init: str = _setting("ours", "--init", "how the attention projections are drawn. ours: W^Q, W^K, W^V each "
                         "Xavier-uniform alone; torch: as nn.MultiheadAttention draws them (one packed 3D x D Xavier "
                         "matrix, so smaller, and zero biases)", choices=INIT_CHOICES)
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
    time_budget: float | None = _setting(None, "--time-budget", "stop after this much time spent in training steps (90s, 25m, "
                                         "1.5h); reading the data, validation and checkpoints come on top (the bar's "
                                         "time left counts them)",
                                         POSITIVE_FLOAT, shown="none", duration=True)
    validate_every: int = _setting(50, "--validate-every", f"steps between validation losses (a multiple of "
                                   f"{LOG_EVERY}; 0 = never; when the data has validation pairs)",
                                   _rule(int, lambda v: 0 <= v <= INT_LIMIT and v % LOG_EVERY == 0,
                                         f"an integer >= 0 and a multiple of {LOG_EVERY} (the steps between "
                                         "logged losses; 0 = never)"))
    checkpoint_every: int = _setting(100, "--checkpoint-every", "steps between checkpoints", POSITIVE)
    average: int = _setting(0, "--average", "at the end, average the last N snapshots of the weights (the paper's "
                            "§6.1) and keep the average where its greedy BLEU on the validation pairs is at least "
                            "the last weights' (0 = off: the last weights)", NONNEGATIVE, metavar="N")
    average_every: int = _setting(100, "--average-every", "steps between the snapshots --average averages", POSITIVE,
                                  metavar="K")
    # --- where and how fast (not recorded: a run may resume elsewhere) ---
    device: str | None = _setting(None, "--device", "cuda, cuda:N, mps or cpu", shown="the best present")
    amp: str = _setting("auto", "--amp", "mixed precision. auto: what the run folder records, else what pays here: "
                        "bf16 on CUDA capability >= 8.0, fp16 below, on a CPU bf16 only with bf16 instructions and "
                        f"measured faster (runs of >= {AMP_MEASURE_MIN_STEPS} steps), else float32. bf16: CUDA or a "
                        "CPU; fp16: CUDA; none: float32", choices=AMP_CHOICES)
    attention: str = _setting("fused", "--attention", "the attention path training takes. fused: "
                              "F.scaled_dot_product_attention; explicit: the matmul-softmax of notebook 04; auto: what "
                              "the run folder records, else the faster of the two over a few timed training steps here "
                              f"(runs of >= {AMP_MEASURE_MIN_STEPS} steps; shorter ones: fused)",
                              choices=ATTENTION_CHOICES)
    threads: int | None = _setting(None, "--threads", "CPU threads for torch",
                                   _rule(int, lambda v: 0 < v <= 1024, "an integer in [1, 1024]"),
                                   shown="torch's choice")
    compile: bool = _setting(False, "--compile", "torch.compile the model (minutes up front; pays on GPUs)", flag=True,
                             shown="off")
    progress: bool = _setting(True, "--no-progress", "hide the progress bar", flag=True, inverted=True, shown="shown")

    def __post_init__(self):
        if isinstance(self.delimiter, str):
            object.__setattr__(self, "delimiter", DELIMITER_NAMES.get(self.delimiter.lower(), self.delimiter))
        for f in dataclasses.fields(self):
            _check_field(f, getattr(self, f.name))
        if self.data_dir is not None and not isinstance(self.data_dir, Path):
            object.__setattr__(self, "data_dir", Path(self.data_dir))
        # Checked now, by building it; the plain builtin corpus is valid as it is, and is built when
        # asked for, so that `course.COURSE_MODEL` does not import the data side (and torch) with `course`.
        plain = self.data == "builtin" and all(getattr(self, name) == TrainSettings.__dataclass_fields__[name].default
                                               for name in SOURCE_FIELDS)
        object.__setattr__(self, "_source", None if plain else _data_source(self))

    @property
    def source(self):
        """The `sources.DataSource` that `data` and the data options describe (`read_source` reads it)."""
        if self._source is None:
            object.__setattr__(self, "_source", _data_source(self))
        return self._source

    @property
    def batch_multiple(self) -> int:
        """The multiple batches are padded to: `pad_to_multiple`, else 8 with `compile` (few shapes,
        so few recompilations), else 1."""
        if self.pad_to_multiple is not None:
            return self.pad_to_multiple
        return COMPILE_PAD_TO_MULTIPLE if self.compile else 1

    def recorded(self) -> dict:
        """The settings a run records in its config.json "training" and compares on resume (besides
        the model, the data and the batches, which config.json records apart); --init and --average only
        where they are not the defaults, so a run without them records what runs recorded before them."""
        return {"seed": self.seed, "max_tokens": self.max_tokens, "warmup": self.warmup, "lr_factor": self.lr_factor,
                "label_smoothing": self.label_smoothing, "cooldown": self.cooldown,
                **({"init": self.init} if self.init != "ours" else {}),
                **({"average": self.average, "average_every": self.average_every} if self.average else {})}


# A resumed run may change these, and says so: the message of a non-finite loss recommends them.
CHANGEABLE_ON_RESUME = ("warmup", "lr_factor", "cooldown")


def option_of(name: str) -> str:
    """The command-line option of a field, for messages."""
    return TrainSettings.__dataclass_fields__[name].metadata["option"]


def _data_source(s: TrainSettings):
    """The DataSource of `s.data` (a spec such as "files:train.de,train.en", or a DataSource) and the
    data options; ValueError/TypeError naming the option (a DataSource takes no options beside it)."""
    from transformer_lib.sources import DataSource, parse_data_spec
    given = {name: getattr(s, name) for name in SOURCE_FIELDS
             if getattr(s, name) != TrainSettings.__dataclass_fields__[name].default}
    if not isinstance(s.data, str):     # a DataSource (a notebook that defines the class has its own copy of it)
        if given:
            raise ValueError(f"data is a DataSource, so give {', '.join(given)} in it, not beside it")
        return s.data if isinstance(s.data, DataSource) else DataSource.from_dict(s.data.to_dict())
    kind = s.data.partition(":")[0]
    if kind == "builtin" and (s.src_lang or s.tgt_lang):
        raise ValueError("--src-lang and --tgt-lang are for multi30k and opus_books (and name the languages of "
                         "files, tsv, csv and hub data); the builtin corpus is English -> Ordo only: leave them out")
    if s.data_dir is not None and kind != "multi30k":
        origin = {"builtin": "the library itself", "opus_books": "the Hugging Face Hub", "hub": "the Hugging Face Hub"}
        raise ValueError(f"--data-dir is for multi30k only ({kind} comes from "
                         f"{origin.get(kind, 'the files --data names')}); leave it out")
    if s.test_fraction is None:        # carved only where the user has no validation pairs of their own
        given["test_fraction"] = 0 if s.valid is not None else TEST_FRACTION
    if kind == "tsv" and given.get("delimiter") == "\t":
        del given["delimiter"]                  # tsv: is tab-separated already
    elif kind == "tsv" and "delimiter" in given:
        raise ValueError(f"--delimiter {given['delimiter']!r}: tsv: is tab-separated; for another separator read the "
                         f"file as csv:{s.data.partition(':')[2]} --delimiter {given['delimiter']!r}")
    fields = {SOURCE_FIELDS[name]: value for name, value in given.items()}
    for name in ("src_column", "tgt_column"):     # "2" from the command line is the third column of a table
        if isinstance(fields.get(name), str) and fields[name].isdigit() and kind in ("tsv", "csv"):
            fields[name] = int(fields[name])
    if "data_dir" in fields:
        fields["data_dir"] = str(fields["data_dir"])
    try:
        return _compressed_prefix(parse_data_spec(s.data, **fields), s.data)
    except (ValueError, TypeError) as error:
        message = " ".join(str(error).split()).replace("valid_fraction + test_fraction", "--valid-fraction + "
                                                        "--test-fraction").replace("with src_lang and tgt_lang",
                                                                                   "with --src-lang and --tgt-lang")
        for name, field in SOURCE_FIELDS.items():     # the API's field names as the options that set them
            message = re.sub(rf"^{field}\b(?= (must|is for))", f"{field} ({option_of(name)})", message)
        message = "--" + message if message.startswith("data '") else message     # parse_data_spec's "data 'x'"
        raise type(error)(message if s.data in message else f"--data {s.data}: {message}") from None


def _compressed_prefix(source, spec: str):
    """files:PREFIX reads PREFIX.LANG, or else PREFIX.LANG.gz (.bz2, .xz) where only that one is there."""
    if source.kind != "files" or "," in spec:
        return source

    def found(pair):
        if pair is None:
            return None
        return tuple(next((path + ending for ending in ("", ".gz", ".bz2", ".xz") if Path(path + ending).exists()),
                          path) for path in pair)
    return dataclasses.replace(source, **{split: found(getattr(source, split)) for split in ("train", "valid", "test")})


def _check_field(f: dataclasses.Field, value) -> None:
    meta, where = f.metadata, f"{f.name} ({f.metadata['option']})"
    if value is None and f.default is None:
        return
    if meta.get("source"):
        if not (isinstance(value, str) and value.strip()) and type(value).__name__ != "DataSource":
            raise TypeError(f"{where} must be a data source such as 'builtin' or 'tsv:pairs.tsv', or a "
                            f"sources.DataSource, got {value!r}")
        return
    if meta.get("delimiter"):
        if not isinstance(value, str) or len(value) != 1 or value in "\"\r\n":
            raise ValueError(f"{where} must be one character other than a quote or a line break, or tab, comma, "
                             f"semicolon, pipe, got {value!r}")
        return
    if meta.get("column"):      # an index from 0 or a name: DataSource checks it
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TypeError(f"{where} must be a column index from 0 or a column name, got {value!r}")
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
