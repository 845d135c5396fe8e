"""A run's config.json: what it records, how a hand-edited or damaged one is named, and the resume
rules (which settings must stay as the run began, which may change and are reported).

Hand-written, not exported: a part of `runs.py` (the run folder), kept apart to keep each file
short. config.json records the model configuration, the data (corpus, languages, folder), the
training settings that decide the updates (`TrainSettings.recorded()`), the number of processes,
gradient accumulation and batch padding, the precision the run began in ("amp") and its attention path
("attention", where --attention was not left at fused), fingerprints
(SHA-256) of its tokenizer and training pairs (and of its validation and test pairs), where its data
came from ("source", a `sources.DataSource` as a dict), the settings changed on resume ("changes"),
and a random id that its checkpoints carry too ("run_id"). It also says which pairs `evaluate` scores.
Runs written before the "format" key (format 1) hold no fingerprints and no training settings;
format 2 recorded no cooldown (0 then) and its checkpoints carry no identity; runs written before
data sources (format 3 without "source") name a corpus only, read as it was then.
"""
import dataclasses
import json
import math
import os
from pathlib import Path

from transformer_lib.settings import (ATTENTION_CHOICES, CHANGEABLE_ON_RESUME, DATA_KINDS, INIT_CHOICES, SEED_LIMIT,
                                      SOURCE_FIELDS, option_of)

FORMAT = 3
CONFIG = "config.json"
AMP_DTYPES = ("bf16", "fp16", "float32")     # the precision a run began in (`train --amp` resolved)
ATTENTION_PATHS = tuple(c for c in ATTENTION_CHOICES if c != "auto")    # what `--attention auto` resumes with
# The option that sets each recorded setting, for messages.
OPTION_OF_FIELD = {"d_model": "--d-model", "n_heads": "--heads", "d_ff": "--d-ff", "n_encoder_layers": "--layers",
                   "n_decoder_layers": "--layers", "dropout": "--dropout", "norm_first": "--post-ln",
                   "max_len": "--max-len", "src_vocab_size": "--vocab-size", "tgt_vocab_size": "--vocab-size",
                   "vocab_size": "--vocab-size", "data": "--data", "src_lang": "--src-lang", "tgt_lang": "--tgt-lang",
                   "attention_dropout": "--attention-dropout", "activation_dropout": "--activation-dropout",
                   "seed": "--seed", "max_tokens": "--max-tokens", "warmup": "--warmup", "lr_factor": "--lr-factor",
                   "label_smoothing": "--label-smoothing", "cooldown": "--cooldown", "init": "--init",
                   "average": "--average", "average_every": "--average-every",
                   "pad_to_multiple": "--pad-to-multiple, or --compile, which pads batches to a multiple of 8 "
                                      "and so makes other batches",
                   **{f"source.{field}": option_of(name) for name, field in SOURCE_FIELDS.items()},
                   "source.name": "--data hub:NAME", "source.config": "--data hub:NAME:CONFIG"}
# What of the recorded data source a resume compares: the kind (as "data"), languages and folder are compared
# apart (with their defaults) or not at all (a moved folder), and where the files lie not (a moved file holds the
# same pairs): the fingerprints of the pairs read decide.
SOURCE_NOT_COMPARED = ("kind", "src_lang", "tgt_lang", "data_dir", "train", "valid", "test")
SPLIT_NAMES = {"train": "training", "valid": "validation", "test": "test"}
# Corpus languages when --src-lang/--tgt-lang are left out (as in load_pairs), so "de" and None compare equal.
DEFAULT_LANGS = {"builtin": (None, None), "multi30k": ("de", "en"), "opus_books": ("en", "it")}


class RunError(Exception):
    """A problem with the arguments or the run folder that the user can fix; the CLI prints it as one line."""


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _int(low: int, high: int | None = None):
    return (lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= low and (high is None or v < high),
            f"an integer >= {low}" + (f" and < {high}" if high else ""))


def _number(low: float, high: float | None = None, open_low: bool = False):
    def ok(v):
        return (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
                and (v > low if open_low else v >= low) and (high is None or v < high))
    return ok, f"a number {'>' if open_low else '>='} {low}" + (f" and < {high}" if high is not None else "")


_OPTIONAL_TEXT = (lambda v: v is None or (isinstance(v, str) and v.strip() != ""), "null or a non-empty string")
_TOP_LEVEL = {"data": (lambda v: v in DATA_KINDS, f"one of {', '.join(DATA_KINDS)}"),
              "src_lang": _OPTIONAL_TEXT, "tgt_lang": _OPTIONAL_TEXT, "data_dir": _OPTIONAL_TEXT,
              "vocab_size": (lambda v: v is None or _int(1)[0](v), "null or an integer >= 1"),
              "processes": _int(1), "accumulate": _int(1), "pad_to_multiple": _int(1),
              "amp": (lambda v: v in AMP_DTYPES, f"one of {', '.join(AMP_DTYPES)}"),
              "attention": (lambda v: v in ATTENTION_PATHS, f"one of {', '.join(ATTENTION_PATHS)}"),
              "changes": (lambda v: isinstance(v, list), "a list of the settings changed on resume"),
              "run_id": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string")}
_TRAINING = {"seed": _int(0, SEED_LIMIT), "max_tokens": _int(1), "warmup": _int(1),
             "lr_factor": _number(0, open_low=True), "label_smoothing": _number(0, 1)}
# cooldown: not recorded before format 3 (0 then); init and averaging: only where not the defaults (ours, 0).
_OPTIONAL_TRAINING = {"cooldown": _number(0, 1), "average": _int(1), "average_every": _int(1),
                      "init": (lambda v: v in INIT_CHOICES, f"one of {', '.join(INIT_CHOICES)}")}
TRAINING_DEFAULTS = {"cooldown": 0.0, "init": "ours", "average": 0}


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


def model_problem(model) -> str | None:
    """What is wrong with a recorded model configuration (a dict of TransformerConfig fields), or None."""
    from transformer_lib.model import TransformerConfig
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
    return None


def _config_problem(meta) -> str | None:
    """What is wrong with the contents of a config.json, or None."""
    if not isinstance(meta, dict):
        return f"it holds a JSON {type(meta).__name__}, not an object"
    if meta.get("format", 1) not in (1, 2, FORMAT):
        return f"\"format\" is {meta['format']!r}: written by another version of transformer_lib, which reads it"
    required = ["model", "data"] + (["training", "fingerprints"] if "format" in meta else [])
    missing = [key for key in required if key not in meta]
    if missing:
        return f"it has no {', '.join(map(repr, missing))}"
    for key, (check, what) in _TOP_LEVEL.items():
        if key in meta and not check(meta[key]):
            return f"\"{key}\" is {meta[key]!r}, expected {what}"
    problem = model_problem(meta["model"])
    if problem or "format" not in meta:
        return problem
    training = meta["training"]
    allowed = set(_TRAINING) | set(_OPTIONAL_TRAINING)
    if not isinstance(training, dict) or not set(_TRAINING) <= set(training) <= allowed:
        return (f"\"training\" is {training!r}, expected an object with {', '.join(_TRAINING)} (and "
                f"{', '.join(_OPTIONAL_TRAINING)})")
    for name, (check, what) in {**_TRAINING, **_OPTIONAL_TRAINING}.items():
        if name in training and not check(training[name]):
            return f"\"training\".\"{name}\" is {training[name]!r}, expected {what}"
    prints = meta["fingerprints"]
    if not (isinstance(prints, dict) and isinstance(prints.get("tokenizer"), str)
            and all(isinstance(prints.get(f"{split}_pairs"), dict) for split in SPLIT_NAMES
                    if split == "train" or f"{split}_pairs" in prints)):
        return (f"\"fingerprints\" is {prints!r}, expected an object with \"tokenizer\" and \"train_pairs\" "
                "(and valid_pairs, test_pairs)")
    return _source_problem(meta)


def _source_problem(meta: dict) -> str | None:
    """What is wrong with the recorded data source (not recorded before data sources: None)."""
    if "source" not in meta:
        return None
    from transformer_lib.sources import DataSource
    try:
        source = DataSource.from_dict(meta["source"])
    except (ValueError, TypeError) as error:
        return f"\"source\" is not a data source ({one_line(error)[:200]})"
    if source.kind != meta["data"]:
        return f"\"source\" is a {source.kind} source, but \"data\" says {meta['data']}"
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
               training: dict, tokenizer_fingerprint: str, train_pairs: dict, pad_to_multiple: int = 1,
               source: dict | None = None, split_prints: dict | None = None) -> dict:
    """The config.json of a run: what decides its model, tokenizer, data, batches and updates; with
    `source` (a DataSource's to_dict) where its data came from, with `split_prints` the fingerprints
    of its validation and test pairs ({"valid": ..., "test": ...})."""
    default_src, default_tgt = DEFAULT_LANGS.get(data, (None, None))
    meta = {"format": FORMAT, "model": dataclasses.asdict(config), "data": data, "src_lang": src_lang or default_src,
            "tgt_lang": tgt_lang or default_tgt, "data_dir": None if data_dir is None else str(data_dir),
            "vocab_size": vocab_size, "processes": processes, "accumulate": accumulate, "training": dict(training),
            "pad_to_multiple": pad_to_multiple, "fingerprints": {"tokenizer": tokenizer_fingerprint,
                                                                 "train_pairs": train_pairs}}
    if source is not None:
        meta["source"] = json.loads(json.dumps(source))        # as config.json gives it back (tuples as lists)
    for split, pairs_print in (split_prints or {}).items():
        meta["fingerprints"][f"{split}_pairs"] = pairs_print
    return meta


def _compared(meta: dict) -> dict:
    src_lang, tgt_lang = DEFAULT_LANGS.get(meta.get("data"), (None, None))
    training = {**TRAINING_DEFAULTS, **meta.get("training", {})} if "training" in meta else {}
    if not training.get("average"):
        training.pop("average_every", None)          # snapshots spaced for no averaging
    source = {f"source.{k}": v for k, v in meta.get("source", {}).items() if k not in SOURCE_NOT_COMPARED}
    return {**meta.get("model", {}), "data": meta.get("data"), "src_lang": meta.get("src_lang") or src_lang,
            "tgt_lang": meta.get("tgt_lang") or tgt_lang, "vocab_size": meta.get("vocab_size"),
            "pad_to_multiple": meta.get("pad_to_multiple", 1), **training, **source}


def check_same_run(run: Path, old: dict, new: dict) -> list[str]:
    """The resume rules, in one place. RunError naming every setting in which `new` differs from the
    run's config.json `old` (settings an older run did not record are not compared), except the
    ones a resumed run may change (`settings.CHANGEABLE_ON_RESUME`: the schedule, which the message
    of a non-finite loss recommends changing): those are returned, as "name old -> new (option)"."""
    was, now = _compared(old), _compared(new)
    for key in now:
        if key not in was or was[key] is None and key == "vocab_size":
            was[key] = now[key]      # not recorded by the version that wrote the run
    differ = [key for key in sorted(was.keys() | now.keys()) if was.get(key) != now.get(key)
              and not (key == "average_every" and was.get("average") != now.get("average"))]   # said by average
    words = {key: f"{key} {was.get(key)} -> {now.get(key)} ({OPTION_OF_FIELD.get(key, 'not an option')})"
             for key in differ}
    refused = [words[key] for key in differ if key not in CHANGEABLE_ON_RESUME]
    if refused:
        raise RunError(f"{run} was trained with another configuration, so it is left as it was: {'; '.join(refused)}. "
                       f"Resume it with its own settings (see {run / CONFIG}) or train into a new --run folder")
    was, now = (old.get("processes", 1), old.get("accumulate", 1)), (new["processes"], new["accumulate"])
    if was != now:
        raise RunError(f"{run} was trained with {was[0]} process(es) × --accumulate {was[1]}, this launch has "
                       f"{now[0]} × --accumulate {now[1]}, so it is left as it was; resume it with "
                       f"torchrun --nproc_per_node={was[0]} (or without torchrun for 1) and --accumulate {was[1]}, "
                       "or train into a new --run folder")
    return [words[key] for key in differ]


def check_same_data(run: Path, meta: dict, pairs_print: dict, where: str, split: str = "train") -> None:
    """RunError when the pairs of `split` differ from those the run recorded (train: format 2 on;
    valid and test: runs that record their data source)."""
    recorded = meta.get("fingerprints", {}).get(f"{split}_pairs")
    if recorded is not None and recorded != pairs_print:
        raise RunError(f"the {SPLIT_NAMES[split]} pairs of {where} ({pairs_print['count']} pairs) are not those {run} "
                       f"was trained on ({recorded.get('count')} pairs; fingerprints in {run / CONFIG} differ), so "
                       "it is left as it was; resume it with its own data, or train into a new --run folder")


# --- the data of a run, for evaluation ----------------------------------------------------------------

def check_data_dir(data: str, data_dir: Path | None) -> None:
    """RunError for a --data-dir that is not a readable folder, or given for data other than multi30k."""
    if data_dir is None:
        return
    try:
        str(data_dir).encode("utf-8")
    except UnicodeEncodeError:
        raise RunError(f"--data-dir {os.fsencode(data_dir)!r}: the path holds bytes that are not UTF-8; rename it, "
                       "or give a path without them") from None
    if data != "multi30k":
        origin = {"builtin": "the library itself", "opus_books": "the Hugging Face Hub", "hub": "the Hugging Face Hub"}
        raise RunError(f"--data-dir is for multi30k only ({data} comes from {origin.get(data, 'its own files')}); "
                       "leave it out")
    if not data_dir.is_dir():
        raise RunError(f"--data-dir {data_dir}: {'a file, not a folder' if data_dir.exists() else 'no such folder'}; "
                       "give the folder that holds train.de.gz, train.en.gz, val.de.gz, ...")


def recorded_source(meta: dict):
    """The DataSource a run's config.json records; for a run recorded before data sources, the
    named corpus it names, read as it was then (nothing carved)."""
    from transformer_lib.sources import DataSource
    if "source" in meta:
        return DataSource.from_dict(meta["source"])
    kind = meta["data"]
    if kind == "builtin":
        return DataSource(kind)
    return DataSource(kind, src_lang=meta.get("src_lang"), tgt_lang=meta.get("tgt_lang"),
                      data_dir=meta.get("data_dir") if kind == "multi30k" else None, valid_fraction=0, test_fraction=0)


def evaluation_pairs(run: Path, meta: dict, split: str, data_dir: Path | None = None, data: str | None = None):
    """The (source, reference) pairs `evaluate` scores: all pairs of `data` (a --data spec, read with the
    run's recorded columns, header and delimiter when it is of the run's kind), or the run's own `split`,
    read from its recorded source (a carved split carved again by the recorded seed) and checked
    against the fingerprint recorded at training (RunError when the files changed since)."""
    import dataclasses

    from transformer_lib.data import MULTI30K_SPLITS, load_pairs
    from transformer_lib.data_files import read_checked
    from transformer_lib.sources import NAMED_SPLITS, fingerprint_pairs, parse_data_spec
    source = recorded_source(meta)
    if data is not None:
        if data_dir is not None:
            raise RunError("--data-dir is where the run's own multi30k files lie; with --data leave it out")
        same = data.partition(":")[0] == source.kind
        table = {k: getattr(source, k) for k in ("src_column", "tgt_column", "header", "delimiter") if same}
        langs = {k: getattr(source, k) for k in ("src_lang", "tgt_lang") if getattr(source, k) and same}
        if data.startswith("hub:"):         # --split names the Hub split to score
            table["train"] = split
        elif split != "test":
            raise RunError(f"--split {split} names a split of the run's own data; with --data {data} all its pairs "
                           "are scored: leave --split out")
        return read_checked(parse_data_spec(data, valid_fraction=0, test_fraction=0, **table, **langs)).train
    check_data_dir(source.kind, data_dir)
    if data_dir is not None:
        source = dataclasses.replace(source, data_dir=str(data_dir))
    own = ("train", "valid", "test") + (tuple(MULTI30K_SPLITS) if source.kind == "multi30k" else ())
    if split not in own:
        raise RunError(f"--split {split}: the run's data ({source.kind}) has the splits {', '.join(own)}; or give "
                       "other pairs with --data")
    try:
        if source.kind in ("builtin", "multi30k"):      # their own files: read that split only
            pairs = load_pairs(source.kind, NAMED_SPLITS[source.kind].get(split, split), source.src_lang,
                               source.tgt_lang, source.data_dir)
        else:
            pairs = getattr(read_checked(source), split)
    except FileNotFoundError as error:
        raise RunError(_data_gone(source, split, error)) from None
    recorded = meta.get("fingerprints", {}).get(f"{split}_pairs")
    if recorded is not None and fingerprint_pairs(pairs) != recorded:
        raise RunError(f"the {SPLIT_NAMES.get(split, split)} pairs of the run's data ({len(pairs)} pairs) are not "
                       f"those {run / CONFIG} recorded ({recorded.get('count')} pairs): its files changed since "
                       "training; put them back, or give the pairs to score with --data")
    if not pairs:
        raise RunError(f"--split {split}: the run's data has no {SPLIT_NAMES.get(split, split)} pairs (none given, "
                       "none carved); give the pairs to score with --data")
    return pairs


def _data_gone(source, split: str, error: BaseException) -> str:
    """Why the run's own `split` cannot be read (a file it was trained on is gone), and what to give instead."""
    if source.kind == "multi30k":
        return (f"{one_line(error)}; give the folder that now holds Multi30k's files with --data-dir FOLDER, or other "
                "pairs to score with --data")
    where = getattr(source, split) or source.train
    files = list(where) if isinstance(where, (list, tuple)) else [where]
    relative = any(f is not None and not os.path.isabs(f) for f in files)
    spec = {"files": "files:SRC,TGT", "tsv": "tsv:FILE", "csv": "csv:FILE"}.get(source.kind, "files:SRC,TGT")
    return (f"{one_line(error)}: the run's {SPLIT_NAMES.get(split, split)} pairs are read from the files it was "
            f"trained on ({', '.join(map(str, files))}), which are not there now"
            + (" (recorded relative to the folder `train` ran in: run evaluate there)" if relative else "")
            + f"; put them back, or give the pairs to score with --data {spec}")
