"""What `train` says while it works: before the first step, the pairs of each split and where they came
from, the model's size and the precision; during training, a bar with the total and the time left and
the validation loss when it is computed; at the end, the validation loss, where the run is, and the
command that scores it.

Hand-written, not exported: a part of `train_run.py`, kept apart to keep each file short.
"""
import random
import shlex
import sys
import time
from pathlib import Path

SPLIT_WORDS = {"train": "training", "valid": "validation", "test": "test"}


def carved_splits(source) -> list[str]:
    """The splits `read_source` carves out of the training pairs: those the source does not give."""
    from transformer_lib.sources import NAMED_SPLITS
    gives = NAMED_SPLITS.get(source.kind) or {split: getattr(source, split) for split in ("valid", "test")}
    return [split for split in ("valid", "test") if gives.get(split) is None]


def dropped_pairs(pairs, tokenizer, max_len: int, multiple: int) -> list[int]:
    """The indices of `pairs` that `TranslationData` drops as longer than `max_len` tokens (<s> and </s>
    included, padded up to `multiple` as its batches are). Only pairs long enough in characters to be
    dropped are tokenized again: a token holds at least one character or the ▁ before the first word, and
    NFC makes at most 3 characters of one."""
    up = lambda n: -(-n // multiple) * multiple     # noqa: E731
    maybe = [i for i, (s, t) in enumerate(pairs) if 3 * max(len(s), len(t)) + 3 + multiple > max_len]
    src = tokenizer.encode_batch([pairs[i][0] for i in maybe], unknown="replace")
    tgt = tokenizer.encode_batch([pairs[i][1] for i in maybe], unknown="replace")
    return [i for i, s, t in zip(maybe, src, tgt) if max(up(len(s)), up(len(t) - 1) + 1) > max_len]


def where_in_file(source, splits, index: int) -> str:
    """Where training pair `index` (of the pairs left after carving) stands in the source's file."""
    carved = sum(len(getattr(splits, split)) for split in carved_splits(source))
    if carved:          # `sources._carve`: the same seed draws the same positions out of all the pairs
        n = len(splits.train) + carved
        taken = set(random.Random(source.seed).sample(range(n), carved))
        index = [i for i in range(n) if i not in taken][index]
    if source.kind == "files":
        return f"line {index + 1} of {source.train[0]} and {source.train[1]}"
    if source.kind == "tsv":
        return f"line {index + 1 + source.header} of {source.train}"
    if source.kind == "csv":
        return f"row {index + 1} of {source.train} (counting rows from 1{', after the header' if source.header else ''})"
    if source.kind == "hub":
        return f"row {index} (counting from 0) of the {source.train} split of {source.name}"
    return f"pair {index + 1:,} of the {source.kind} training split"


def data_option(s, split: str) -> str:
    """The options that chose the pairs of `split` (for the messages of a resume with other data)."""
    where = f"--data {s.data}" + (f" --data-dir {s.data_dir}" if s.data_dir else "")
    if split == "train" or s.source.kind in ("builtin", "multi30k"):
        return where
    given = getattr(s.source, split)
    return f"--{split} {s.valid if split == 'valid' else s.test}" if given is not None else (
        f"{where} carved by --{split}-fraction {getattr(s.source, split + '_fraction')} --split-seed {s.split_seed}")


def data_lines(s, source, splits, dropped: dict) -> list[str]:
    """The block said before the first step about the data: one line a split, and what was dropped."""
    carved = carved_splits(source)
    lines = [f"data: --data {s.data if isinstance(s.data, str) else source.kind}"]
    for split in ("train", "valid", "test"):
        pairs = getattr(splits, split)
        if split in getattr(splits, "missing", {}):      # a Multi30k folder without it: `evaluate` needs --data
            origin = f"none: {splits.missing[split]}"
        elif split not in carved:
            origin = _origin(source, split)
        elif split in carved and pairs:
            origin = (f"carved out of the training pairs with --split-seed {source.seed} "
                      f"(--{split}-fraction {getattr(source, split + '_fraction'):g})")
        elif split in carved:
            origin = ("none: --valid is given, so none are carved (score your own test pairs with evaluate --data)"
                      if split == "test" and source.valid is not None else f"none (--{split}-fraction 0)")
        lines.append(f"  {SPLIT_WORDS[split]:<10} {len(pairs):>9,} pairs  {origin}")
    for split, (count, first) in dropped.items():
        if count:
            lines.append(f"  dropped {count:,} {SPLIT_WORDS[split]} pair(s) longer than --max-len {s.max_len} tokens "
                         f"(<s> and </s> included){'; the first: ' if split == 'train' else ': '}{first}")
    return lines


def _origin(source, split: str) -> str:
    """Where the pairs of a split that was not carved came from."""
    from transformer_lib.sources import NAMED_SPLITS
    if source.kind in NAMED_SPLITS:
        return f"the {source.kind} corpus's own {NAMED_SPLITS[source.kind][split]} split"
    where = getattr(source, split)
    if source.kind == "hub":
        return f"the {where} split of {source.name}"
    return "from " + (" and ".join(where) if isinstance(where, tuple) else where)


def model_line(s, parameters: int, vocabulary: int) -> str:
    return (f"model: {s.layers} encoder and {s.layers} decoder layers, --d-model {s.d_model}, --heads {s.heads}, "
            f"--d-ff {s.d_ff}, a vocabulary of {vocabulary:,} tokens (--vocab-size {s.vocab_size:,}): "
            f"{parameters:,} parameters")


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """The bar (tqdm.auto) of one launch, fed by the trainer's callbacks: the share of the run done (of
    --max-steps or --time-budget, whichever ends it first), the step, the time left, the last losses.
    Without a bar (`show` False), each validation loss is one line on stderr."""

    def __init__(self, trainer, max_steps: int | None, time_budget: float | None, show: bool, say):
        self.max_steps, self.time_budget, self.say, self.bar = max_steps, time_budget, say, None
        self.start, self.start_step, self.start_elapsed = time.perf_counter(), trainer.state.step, trainer.state.elapsed
        self.loss = self.valid = None
        if show:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=1000, initial=round(1000 * trainer.run_progress()), file=sys.stderr,
                            bar_format="{percentage:3.0f}%|{bar}| {desc}", dynamic_ncols=True)
            self.bar.set_description_str(self._postfix(trainer), refresh=True)
        trainer.add_callback("on_batch_end", self.on_batch_end)
        trainer.add_callback("on_log", self.on_log)

    def time_left(self, trainer) -> float | None:
        """Seconds of wall time until the first stop condition, at this launch's pace so far."""
        wall, steps = time.perf_counter() - self.start, trainer.state.step - self.start_step
        trained = trainer.state.elapsed - self.start_elapsed
        if steps <= 0 or wall <= 0:
            return None
        left = []
        if self.max_steps is not None:
            left.append((self.max_steps - trainer.state.step) * wall / steps)
        if self.time_budget is not None and trained > 0:
            left.append((self.time_budget - trainer.state.elapsed) * wall / trained)
        return max(0.0, min(left)) if left else None

    def _postfix(self, trainer) -> str:
        step = trainer.state.step
        parts = [f"step {step}" + (f"/{self.max_steps}" if self.max_steps is not None else "")]
        left = self.time_left(trainer)
        parts.append(f"{_clock(left)} left" if left is not None else "time left: after the first steps")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        if self.valid is not None:
            parts.append(f"validation loss {self.valid[1]:.3f} (step {self.valid[0]})")
        return ", ".join(parts)

    def on_batch_end(self, trainer) -> None:
        if self.bar is not None:
            self.bar.set_description_str(self._postfix(trainer), refresh=False)
            self.bar.update(round(1000 * trainer.run_progress()) - self.bar.n)

    def on_log(self, trainer) -> None:
        entry = trainer.state.history[-1]
        self.loss = entry["loss"]
        if "valid_loss" in entry:
            self.valid = (entry["step"], entry["valid_loss"])
            if self.bar is None:
                self.say(f"step {entry['step']}: validation loss {entry['valid_loss']:.3f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def last_valid_loss(history: list) -> tuple[int, float] | None:
    found = [(h["step"], h["valid_loss"]) for h in history if "valid_loss" in h]
    return found[-1] if found else None


def end_lines(summary: dict, run: Path, moved_from: Path | None, splits: dict, wall_s: float) -> list[str]:
    """What `train` says when it ends: the steps and times, the validation loss, where the run is and how
    to score it."""
    valid = last_valid_loss(summary.get("history", []))
    lines = [f"trained to step {summary['steps']}: {wall_s:.1f} s this launch, {summary['train_seconds']:.1f} s in "
             "training steps in all (what --time-budget counts); " + (
                 f"validation loss {valid[1]:.3f} at step {valid[0]}" if valid else
                 "no validation loss (no validation pairs, or --validate-every 0)")]
    if summary.get("averaging"):
        from transformer_lib.recipe import averaging_line
        lines.append(averaging_line(summary["averaging"]))
    lines.append(f"the run is in the folder {run}" + (f" (moved there from {moved_from} while it trained)" if moved_from else ""))
    command = ["python", "-m", "transformer_lib", "evaluate", "--run", str(run)]
    if splits.get("test"):
        lines.append(f"score it on its {splits['test']:,} test pairs: {shlex.join(command)}")
    elif splits.get("valid"):
        lines.append(f"score it: {shlex.join(command + ['--split', 'valid'])} (it has no test split; score your own "
                     "test pairs with --data files:SRC,TGT, tsv:FILE or csv:FILE)")
    else:
        lines.append(f"score it on your test pairs: {shlex.join(command)} --data files:SRC,TGT")
    return lines
