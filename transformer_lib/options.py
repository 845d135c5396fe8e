"""The command line's options for `TrainSettings`: one option a field, parsed and checked as the field
wants (its rule, choices, path or duration), its default and help said once, from the field.

Hand-written, not exported: a part of `settings.py`, kept apart to keep each file short; `cli.py`
builds `train`'s options with `add_setting` and uses the parsers for its other commands too;
`train_command` goes the other way, from a `TrainSettings` to the `train` command that builds it.
"""
import argparse
import dataclasses
import math
import re
from pathlib import Path


def checked_number(rule: dict):
    """An argparse `type` that parses `rule["kind"]` and accepts finite values where `rule["ok"]` holds."""
    def parse(text: str):
        try:
            value = rule["kind"](text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"must be {rule['wanted']}, got {text!r}") from None
        if not (math.isfinite(value) and rule["ok"](value)):
            raise argparse.ArgumentTypeError(f"must be {rule['wanted']}, got {text!r}")
        return value
    return parse


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (`translate --alpha`, and each candidate of `alpha_choice`)."""
    return checked_number({"kind": float, "ok": lambda v: v >= 0, "wanted": "a finite number >= 0"})(text)


def alpha_choice(text: str) -> float | tuple[float, ...] | str:
    """`evaluate --alpha`: one α (a number >= 0); or candidates to choose from on the validation set,
    numbers separated by commas, or `auto` for `transformer_lib.evaluation.ALPHA_CANDIDATES`."""
    if text == "auto":
        return text
    try:
        alphas = tuple(nonnegative_float(word) for word in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (e.g. 0.6), such numbers separated by commas to "
                                         f"choose from on the validation set (e.g. 0.6,1.0,1.4), or auto; got {text!r}") from None
    return alphas[0] if len(alphas) == 1 else alphas


def path_argument(text: str) -> Path:
    """A path that is not empty: '' would mean the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a path, got {text!r} (an empty path would mean the current folder)")
    return Path(text)


def parse_duration(text: str) -> float:
    """'90', '90s', '25m' or '1.5h' -> seconds (finite, > 0)."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError, OverflowError):
        seconds = float("nan")
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 90s, 25m, 1.5h)")
    return seconds


def device_name(text: str) -> str:
    """cpu, cuda, cuda:N or mps (whether it is present is checked when the command runs)."""
    if not re.fullmatch(r"cpu|cuda(:\d{1,4})?|mps", text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use cpu, cuda, cuda:N or mps")
    return text


def add_setting(parser: argparse.ArgumentParser, f: dataclasses.Field) -> None:
    """One option for one field of TrainSettings, its default said once, from the field."""
    meta = f.metadata
    shown = meta["shown"] if meta["shown"] is not None else f.default
    text = f"{meta['help']} (default: {shown})"
    if meta.get("flag"):
        parser.add_argument(meta["option"], dest=f.name, action="store_false" if meta.get("inverted") else "store_true",
                            help=text)
        return
    kind = (parse_duration if meta.get("duration") else path_argument if meta.get("path")
            else device_name if f.name == "device" else checked_number(meta["rule"]) if meta["rule"] else None)
    parser.add_argument(meta["option"], dest=f.name, type=kind, default=f.default, choices=meta.get("choices"),
                        metavar=meta.get("metavar"), help=text)


def train_command(settings, run) -> list[str]:
    """The words of the `python -m transformer_lib train` command that builds `settings` (a TrainSettings)
    into the run folder `run`: the option of every field that is not at its default."""
    words = ["python", "-m", "transformer_lib", "train", "--run", str(run)]
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if value == f.default:
            continue
        if not isinstance(value, (str, int, float, Path)):
            raise ValueError(f"{f.name} is a {type(value).__name__}, which no option of train writes")
        if f.metadata.get("flag"):
            words.append(f.metadata["option"])
        else:
            text = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
            words += [f.metadata["option"], text]
    return words
