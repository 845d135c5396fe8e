"""Command line for the course: `python -m transformer_lib {train,translate,evaluate} --help`.

Hand-written (no notebook is its home): argument parsing and the three commands, wiring the
notebooks' exported pieces together, the same code the notebooks run. What a run folder holds and
how it is checked, locked and written lives in `transformer_lib/runs.py`.

Data-parallel training: `torchrun --standalone --nproc_per_node=N -m transformer_lib -- train --run R ...`
starts N processes that train one model together (DistributedDataParallel; gloo on the CPU, NCCL
on GPUs): rank 0 checks everything and writes the run folder while the others wait, then every
update averages the gradients of N batches, as one process with `--accumulate N` does. (The `--`
keeps torchrun from taking `--run` for an abbreviation of its own `--run-path`.)

Every problem the user can fix (a bad argument, a damaged or foreign file, a folder that cannot be
written, a run another `train` is writing) is one `error: ...` line and exit code 2, with nothing
written. Ctrl-C (or SIGTERM) during `train` finishes the current step, saves a checkpoint there and
exits 130 (143) with the command that resumes it; a finished run says so and changes nothing.
"""
import argparse
import contextlib
import json
import math
import os
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from transformer_lib import runs
from transformer_lib.course import COURSE_MODEL_ARGS, course_model   # noqa: F401  (notebook 11 imports them here)
from transformer_lib.runs import RunError, one_line

# torch and the course's other modules are imported inside the commands, after argparse has checked
# the arguments: a mistyped option is answered at once instead of after torch's seconds of import.

AMP_CHOICES = ("auto", "bf16", "fp16", "none")
# `--amp auto` on a CPU with bf16 instructions times 32 training steps (4 batches, 4 rounds, 2 precisions,
# `device.faster_cpu_autocast`): done only for runs of at least this many steps (or a --time-budget).
AMP_MEASURE_MIN_STEPS = 1000
COMPILE_PAD_TO_MULTIPLE = 8     # `train --compile` pads S and T of each batch to a multiple of this
INT_LIMIT = 2 ** 31 - 1     # the largest count or size an option takes (torch sizes are 64-bit, but no run needs more)


def _checked_number(kind: type, ok, wanted: str):
    """An argparse `type` that parses `kind` and accepts finite values where `ok(value)` holds."""
    def parse(text: str):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value
    return parse


positive_int = _checked_number(int, lambda v: 0 < v <= INT_LIMIT, f"a positive integer (at most {INT_LIMIT})")
nonnegative_int = _checked_number(int, lambda v: 0 <= v <= INT_LIMIT, f"an integer >= 0 (at most {INT_LIMIT})")
seed_int = _checked_number(int, lambda v: 0 <= v < runs.SEED_LIMIT, f"an integer in [0, {runs.SEED_LIMIT - 1}]")
positive_float = _checked_number(float, lambda v: v > 0, "a finite number > 0")
nonnegative_float = _checked_number(float, lambda v: v >= 0, "a finite number >= 0")
probability = _checked_number(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
sequence_length = _checked_number(int, lambda v: 2 <= v <= INT_LIMIT, "an integer >= 2 (<s> and </s> included)")


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
    except (ValueError, IndexError):
        seconds = float("nan")
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 90s, 25m, 1.5h)")
    return seconds


def device_name(text: str) -> str:
    """cpu, cuda, cuda:N or mps (whether it is present is checked when the command runs)."""
    if not re.fullmatch(r"cpu|cuda(:\d{1,4})?|mps", text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use cpu, cuda, cuda:N or mps")
    return text


def torch_device(device):
    import torch
    return torch.device(device)


def _is_main_process() -> bool:
    """False in the processes that torchrun starts besides rank 0: they keep quiet about errors."""
    return os.environ.get("RANK", "0") == "0"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is answered with one line, not the whole usage text (by rank 0 only)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n" if _is_main_process() else None)


def _add_train_arguments(train: argparse.ArgumentParser) -> None:
    train.add_argument("--run", type=path_argument, required=True, help="run folder (see transformer_lib/runs.py)")
    train.add_argument("--data", default="builtin", choices=runs.CORPORA, help="corpus")
    train.add_argument("--data-dir", type=path_argument, default=None,
                       help="multi30k only: local folder of its files (default: $MULTI30K_DIR, else the Hub)")
    train.add_argument("--src-lang", default=None, help="multi30k, opus_books: source language (de, en)")
    train.add_argument("--tgt-lang", default=None, help="multi30k, opus_books: target language (en, it)")
    train.add_argument("--vocab-size", type=positive_int, default=1000, help="shared BPE vocabulary size")
    train.add_argument("--d-model", type=positive_int, default=128, help="model width")
    train.add_argument("--heads", type=positive_int, default=4, help="attention heads")
    train.add_argument("--d-ff", type=positive_int, default=512, help="feed-forward hidden width")
    train.add_argument("--layers", type=positive_int, default=2, help="encoder layers and decoder layers (each)")
    train.add_argument("--dropout", type=probability, default=0.1, help="dropout probability")
    train.add_argument("--attention-dropout", type=probability, default=None,
                       help="dropout on attention weights (default: --dropout; 0 = the paper)")
    train.add_argument("--activation-dropout", type=probability, default=None,
                       help="dropout on feed-forward hidden units (default: --dropout; 0 = the paper)")
    train.add_argument("--post-ln", action="store_true", help="post-LN as in the paper (default: pre-LN)")
    train.add_argument("--max-len", type=sequence_length, default=512,
                       help="longest sequence in tokens; longer training pairs are dropped")
    train.add_argument("--label-smoothing", type=probability, default=0.1, help="label smoothing ε")
    train.add_argument("--max-tokens", type=positive_int, default=4096, help="padded tokens per batch")
    train.add_argument("--accumulate", type=positive_int, default=1,
                       help="batches per update (gradient accumulation): their mean gradient, as N processes give")
    train.add_argument("--warmup", type=positive_int, default=400, help="warmup steps of the inverse-sqrt schedule")
    train.add_argument("--lr-factor", type=positive_float, default=1.0, help="multiplies the paper's learning rate")
    train.add_argument("--cooldown", type=probability, default=0.0,
                       help="share of the run (of --max-steps or --time-budget) over which the rate falls linearly to 0")
    train.add_argument("--validate-every", type=nonnegative_int, default=50,
                       help="steps between validation losses (a multiple of 10; 0 = never; corpora with a valid split)")
    train.add_argument("--max-steps", type=nonnegative_int, default=None, help="stop after this many steps")
    train.add_argument("--time-budget", type=parse_duration, default=None, help="stop after this much training time (25m)")
    train.add_argument("--checkpoint-every", type=positive_int, default=100, help="steps between checkpoints")
    train.add_argument("--seed", type=seed_int, default=0, help="random seed (data order, init, dropout)")
    train.add_argument("--device", type=device_name, default=None, help="cuda, mps or cpu (default: the best present)")
    train.add_argument("--amp", default="auto", choices=AMP_CHOICES,
                       help="mixed precision. auto: what the run folder records, else what pays here: bf16 on "
                            "CUDA capability >= 8.0, fp16 below, on a CPU bf16 only with bf16 instructions and "
                            f"measured faster (runs of >= {AMP_MEASURE_MIN_STEPS} steps), else float32. bf16: CUDA "
                            "or a CPU; fp16: CUDA; none: float32")
    train.add_argument("--threads", type=_checked_number(int, lambda v: 0 < v <= 1024, "an integer in [1, 1024]"),
                       default=None, help="CPU threads for torch")
    train.add_argument("--compile", action="store_true",
                       help="torch.compile the model (minutes up front; pays on GPUs); batches are padded to a "
                            f"multiple of {COMPILE_PAD_TO_MULTIPLE} unless --pad-to-multiple says otherwise")
    train.add_argument("--pad-to-multiple", type=positive_int, default=None,
                       help=f"pad each batch's lengths to a multiple of this (default {COMPILE_PAD_TO_MULTIPLE} with "
                            "--compile, else 1); it decides which sentences share a batch, so a run resumes only "
                            "with the value it began with")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m transformer_lib", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _add_train_arguments(commands.add_parser("train", help="train a model; resumes if the run folder has a checkpoint",
                                             formatter_class=argparse.ArgumentDefaultsHelpFormatter))
    for name, text in (("translate", "translate sentences (arguments, or one per line on stdin)"),
                       ("evaluate", "score a trained model on a test split with sacreBLEU")):
        sub = commands.add_parser(name, help=text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        sub.add_argument("--run", type=path_argument, required=True, help="run folder written by `train`")
        sub.add_argument("--beam", type=positive_int, default=1, help="beam size (1 = greedy)")
        sub.add_argument("--alpha", type=nonnegative_float, default=0.6, help="length penalty α for beam search")
        sub.add_argument("--device", type=device_name, default=None, help="cuda, mps or cpu (default: the best present)")
        sub.add_argument("--compile", action="store_true", help="torch.compile encode and decode (pays on large test sets)")
        if name == "translate":
            sub.add_argument("sentences", nargs="*",
                             help="source sentences (default: stdin, one per line; a blank line gives a blank line)")
        else:
            sub.add_argument("--split", default="test", help="split to score (multi30k: test_2016, test_2017)")
            sub.add_argument("--data-dir", type=path_argument, default=None, help="multi30k runs: local folder")
            sub.add_argument("--limit", type=positive_int, default=None, help="score only the first N sentences")
            sub.add_argument("--output", type=path_argument, default=None,
                             help="write metrics and translations to this JSON file")
    return parser


def resolve_device(name=None):
    """The torch.device for `name` (None: the best present); RunError if that device is not here."""
    import torch
    from transformer_lib.device import pick_device
    if name is None:
        return pick_device()
    device = torch.device(device_name(str(name)))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RunError(f"--device {name}: this torch sees no CUDA GPU; use --device cpu (or leave --device out)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise RunError(f"--device {name}: there are only {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise RunError(f"--device {name}: Apple's MPS is not available here; use --device cpu")
    return device


def _check_data_dir(data: str, data_dir: Path | None) -> None:
    if data_dir is not None and data != "multi30k":
        raise RunError(f"--data-dir is for multi30k only ({data} comes from "
                       f"{'the library itself' if data == 'builtin' else 'the Hugging Face Hub'}); leave it out")
    if data_dir is not None and not data_dir.is_dir():
        raise RunError(f"--data-dir {data_dir}: {'a file, not a folder' if data_dir.exists() else 'no such folder'}; "
                       "give the folder that holds train.de.gz, train.en.gz, val.de.gz, ...")


def _check_train_args(args, device) -> None:
    """RunError for settings that contradict each other or this machine (before any work)."""
    if args.amp == "fp16" and device.type != "cuda" or args.amp == "bf16" and device.type not in ("cuda", "cpu"):
        raise RunError(f"--amp {args.amp} does not run on {device.type}; fp16 needs CUDA, bf16 CUDA or the CPU")
    if args.max_steps is None and args.time_budget is None:
        raise RunError("give --max-steps or --time-budget (or both), or training never stops")
    if args.validate_every % LOG_EVERY:
        raise RunError(f"--validate-every must be a multiple of {LOG_EVERY} (the steps between logged losses), "
                       f"got {args.validate_every}")
    if args.data == "builtin" and (args.src_lang or args.tgt_lang):
        raise RunError("--src-lang and --tgt-lang are for multi30k and opus_books; the builtin corpus is "
                       "English -> Ordo only: leave them out")
    _check_data_dir(args.data, args.data_dir)


LOG_EVERY = 10    # steps between the mean losses logged in history.json


def resolve_amp(choice: str, device, model=None, batches=None, loss_fn=None) -> str | None:
    """`--amp` as the Trainer takes it: "bf16", "fp16" or None (float32). "auto" asks `pick_amp`: on
    CUDA by capability; on a CPU with bf16 instructions, bf16 only if it trains faster on `batches()`
    (a callable, so that they are built only to be measured; None: not measured, float32); else float32."""
    if choice != "auto":
        return None if choice == "none" else choice
    from transformer_lib.device import cpu_has_native_bf16, pick_amp
    device = torch_device(device)
    measure = device.type == "cpu" and batches is not None and cpu_has_native_bf16()
    return pick_amp(device, model, batches() if measure else None, loss_fn)


def _run_amp(args, device, old_meta: dict | None, model, data, loss_fn) -> str | None:
    """The precision of this launch. `--amp auto` keeps the one the run folder records (so a resumed
    run trains as it began) where it runs on `device`; otherwise it resolves it, measuring on a CPU
    with bf16 instructions only for a run long enough to repay the measurement's steps."""
    recorded = (old_meta or {}).get("amp")
    if args.amp == "auto" and recorded is not None and _amp_runs_on(recorded, device):
        return None if recorded == "float32" else recorded
    long_enough = args.max_steps is None or args.max_steps >= AMP_MEASURE_MIN_STEPS
    return resolve_amp(args.amp, device, model, loss_fn=loss_fn, batches=(
        lambda: [batch.to(device) for batch in data.batches(0, seed=args.seed)[:4]]) if long_enough else None)


def _amp_runs_on(amp: str, device) -> bool:
    return amp == "float32" or device.type == "cuda" or (amp == "bf16" and device.type == "cpu")


def _config_from_args(args, vocab_size: int, pad_id: int):
    from transformer_lib.model import TransformerConfig
    return TransformerConfig(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=args.d_model,
                             n_heads=args.heads, d_ff=args.d_ff, n_encoder_layers=args.layers,
                             n_decoder_layers=args.layers, dropout=args.dropout, norm_first=not args.post_ln,
                             max_len=args.max_len, pad_id=pad_id, attention_dropout=args.attention_dropout,
                             activation_dropout=args.activation_dropout)


def _run_meta(args, config, world_size: int, tokenizer_fingerprint: str = "", train_pairs: dict | None = None):
    training = {"seed": args.seed, "max_tokens": args.max_tokens, "warmup": args.warmup, "lr_factor": args.lr_factor,
                "label_smoothing": args.label_smoothing}
    return runs.new_config(config, args.data, args.src_lang, args.tgt_lang, args.data_dir, args.vocab_size, world_size,
                           args.accumulate, training, tokenizer_fingerprint, train_pairs or {}, _pad_to_multiple(args))


def _pad_to_multiple(args) -> int:
    """Batches of a compiled model are padded to a multiple of 8: few shapes, so few recompilations."""
    if args.pad_to_multiple is not None:
        return args.pad_to_multiple
    return COMPILE_PAD_TO_MULTIPLE if args.compile else 1


# --- train -----------------------------------------------------------------------------------------

class _Signals:
    """SIGINT (Ctrl-C) and SIGTERM during `train`: while training, the step under way finishes and
    `received` is set, for the callback that then saves a checkpoint; at any other `phase`
    ("preparing", "finishing"), or a second time, they stop at once (`_Stopped`). Main thread only."""

    def __init__(self):
        self.phase, self.received, self._saved = "preparing", None, {}

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._saved[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        if self.phase == "training" and self.received is None:
            self.received = signum
            return
        raise _Stopped(signum, phase=self.phase)


class _Stopped(KeyboardInterrupt):
    """A signal stopped `train` in `phase`; `step` is set when a checkpoint was saved at that step."""

    def __init__(self, signum: int, step: int | None = None, phase: str = "training"):
        super().__init__(signum)
        self.signum, self.step, self.phase = signum, step, phase

    def message(self, run: Path, again: str) -> str:
        """The one line that says what was kept and how to go on."""
        checkpoint = run / runs.CHECKPOINT
        if self.step is not None:
            return f"interrupted at step {self.step}: saved {checkpoint}; resume with the same command: {again}"
        if self.phase == "preparing":
            return (f"interrupted before the first step, so no training was lost; start it with the same command: "
                    f"{again}")
        if self.phase == "finishing":
            return (f"interrupted after the last step, which {checkpoint} holds; {run / runs.HISTORY} may not be "
                    "written")
        return (f"interrupted twice, so stopped at once without saving: the steps since the last checkpoint are "
                f"lost; resume from it with the same command: {again}")


def _stop_callback(signals: _Signals, save, context) -> callable:
    """An on_batch_end callback: when a signal came, save a checkpoint at this step and stop. Under
    torchrun the ranks agree at every logged step (an all-reduce), so they all stop at the same one."""
    def stop(trainer) -> None:
        received = signals.received
        if context is not None:
            if trainer.state.step % LOG_EVERY:
                return
            import torch
            import torch.distributed as dist
            flag = torch.tensor([received or 0], device=trainer.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            received = int(flag.item()) or None
        if received:
            save(trainer)
            raise _Stopped(received, trainer.state.step)
    return stop


class _RankZeroRefused(RunError):
    """Raised on the other ranks when rank 0 refused the command (rank 0 prints the reason)."""


# Set on a rank other than 0 once rank 0 has accepted the command: an error from then on is this
# rank's own, and it says so (before, its errors are the same as rank 0's, which prints them).
_OWN_ERRORS = {"speak": False}


def _prepare_run(args, device, world_size: int, write: bool) -> dict:
    """Check the run folder, data and arguments, and build the model, data and optimizer; with
    `write`, then write config.json and tokenizer.json of a new run. A finished run returns at once
    ({"finished": why, ...}). Rank 0 calls it with write=True before the other ranks."""
    from transformer_lib.data import TranslationData, load_pairs
    from transformer_lib.model import build_transformer
    from transformer_lib.tokenization import train_bpe_tokenizer
    from transformer_lib.training import LabelSmoothingLoss, load_weights, make_optimizer, translation_loss, validation_loss
    run, old_meta, checkpoint = args.run, None, None
    if (run / runs.CONFIG).is_file():
        old_meta, old_config = runs.read_config(run)
        tokenizer = runs.load_tokenizer(run, old_meta, old_config)
        config = _config_from_args(args, tokenizer.vocab_size, tokenizer.pad_id)
        runs.check_same_run(run, old_meta, _run_meta(args, config, world_size))
        model = build_transformer(config).to(device)
        if (run / runs.CHECKPOINT).is_file():   # read and fit now, so a bad file is refused before anything runs
            checkpoint = runs.read_checkpoint(run, device)
            runs.apply_checkpoint(run / runs.CHECKPOINT, checkpoint, lambda c: load_weights(model, c["model"]))
            finished = runs.finished_reason(checkpoint["state"], args.max_steps, args.time_budget)
            if finished:
                return {"finished": finished, "checkpoint": checkpoint, "model": model}
    else:
        runs.check_new_run_folder(run)
    train_pairs = load_pairs(args.data, "train", src_lang=args.src_lang, tgt_lang=args.tgt_lang, data_dir=args.data_dir)
    pairs_print = runs.fingerprint_pairs(train_pairs)
    if old_meta is not None:
        runs.check_same_data(run, old_meta, pairs_print, f"--data {args.data}" + (
            f" --data-dir {args.data_dir}" if args.data_dir else ""))
    else:
        tokenizer = train_bpe_tokenizer([s for pair in train_pairs for s in pair], vocab_size=args.vocab_size)
        config = _config_from_args(args, tokenizer.vocab_size, tokenizer.pad_id)
        model = build_transformer(config).to(device)
    try:
        data = TranslationData(train_pairs, tokenizer, args.max_tokens, max_len=config.max_len,
                               pad_to_multiple=_pad_to_multiple(args))
    except ValueError as error:
        if "max_tokens" not in str(error):
            raise
        raise RunError(f"--max-tokens {args.max_tokens}: {one_line(error)}") from None
    if not len(data):
        raise RunError(f"the length filter removed all {len(train_pairs)} training pairs: none fits in "
                       f"--max-len {config.max_len} tokens (<s> and </s> included); raise --max-len")
    per_update = world_size * args.accumulate
    if per_update > 1 and len(data.batches(0, seed=args.seed)) < per_update:
        raise RunError(f"an epoch has {len(data.batches(0, seed=args.seed))} batches, fewer than the {per_update} "
                       f"that one update takes ({world_size} process(es) × --accumulate {args.accumulate}); "
                       "lower --max-tokens, --accumulate or the number of processes")
    optimizer, scheduler = make_optimizer(model, config.d_model, args.warmup, args.lr_factor, cooldown=args.cooldown)
    criterion = LabelSmoothingLoss(args.label_smoothing, ignore_index=tokenizer.pad_id)
    loss_fn = lambda m, b: translation_loss(m, b, criterion)   # noqa: E731
    validate = None
    if args.validate_every and args.data != "opus_books":     # the Hub's opus_books has a train split only
        valid_pairs = load_pairs(args.data, "valid", src_lang=args.src_lang, tgt_lang=args.tgt_lang,
                                 data_dir=args.data_dir)
        valid_batches = TranslationData(valid_pairs, tokenizer, args.max_tokens, max_len=config.max_len,
                                        pad_to_multiple=_pad_to_multiple(args)).batches(0, shuffle=False)
        validate = lambda m: validation_loss(m, valid_batches, loss_fn)   # noqa: E731
    amp = _run_amp(args, device, old_meta, model, data, loss_fn)
    # Everything checked: only now is the run folder written (config.json last, so its presence means
    # the tokenizer is there too). A run of format 1 gets its fingerprints and training settings, and
    # a run that records no precision the one it resumes with (the other ranks read it from there).
    if write and (old_meta is None or "format" not in old_meta or "amp" not in old_meta):
        if old_meta is None or "format" not in old_meta:
            fingerprint = (runs.save_tokenizer(run, tokenizer) if old_meta is None
                           else runs.fingerprint_bytes((run / runs.TOKENIZER).read_bytes()))
            meta = _run_meta(args, config, world_size, fingerprint, pairs_print)
        else:
            meta = dict(old_meta)
        runs.write_json(run / runs.CONFIG, {**meta, "amp": amp or "float32"})
    return {"model": model, "data": data, "optimizer": optimizer, "scheduler": scheduler,
            "loss_fn": loss_fn, "validate": validate, "checkpoint": checkpoint, "amp": amp}


def _prepare_in_turn(args, device, context, resources: contextlib.ExitStack) -> dict:
    """On rank 0 (or alone): check that the run folder can be written, lock it (held in `resources`)
    and `_prepare_run`; then on the other ranks, which wait for rank 0's verdict: when it refuses,
    every rank stops (rank 0 alone prints the reason)."""
    import torch.distributed as dist

    def first() -> dict:
        runs.check_writable(args.run, "--run", folder=True)
        resources.enter_context(runs.TrainLock(args.run))
        return _prepare_run(args, device, context.world_size if context else 1, write=True)
    if context is None:
        return first()
    verdict = [None]
    if context.rank == 0:
        try:
            prepared = first()
        except (RunError, ValueError, TypeError, OSError) as error:
            verdict = [one_line(error)]
            dist.broadcast_object_list(verdict, src=0)
            raise
        dist.broadcast_object_list(verdict, src=0)
        return prepared
    dist.broadcast_object_list(verdict, src=0)      # waits until rank 0 has checked and written the run
    if verdict[0] is not None:
        raise _RankZeroRefused(verdict[0])
    _OWN_ERRORS["speak"] = True
    return _prepare_run(args, device, context.world_size, write=False)


def train_command(args, announce: bool = True) -> dict:
    """Train (or resume) a run; return its summary (with "amp", the precision it trained in). Everything
    is checked before the run folder is written, so a refused command leaves it as it was. Under
    torchrun, every process runs this. `announce` prints the precision, the step it resumes at, or that
    the run is finished (course_model keeps the notebooks' output free of them)."""
    import torch
    from transformer_lib.distributed import (DistributedTrainer, distributed_checkpoint_callback,
                                             launched_by_torchrun, save_on_rank_zero, setup_distributed)
    from transformer_lib.training import Trainer, checkpoint_callback, save_checkpoint
    device = resolve_device(args.device)
    _check_train_args(args, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    context = setup_distributed(device) if launched_by_torchrun() else None
    device, rank, world_size = (context.device, context.rank, context.world_size) if context else (device, 0, 1)
    checkpoint_path = args.run / runs.CHECKPOINT
    with contextlib.ExitStack() as resources:
        signals = resources.enter_context(_Signals())
        torch.manual_seed(args.seed)
        prepared = _prepare_in_turn(args, device, context, resources)
        parameters = sum(p.numel() for p in prepared["model"].parameters())
        if "finished" in prepared:
            if rank == 0 and announce:
                print(f"{args.run} is finished: {prepared['finished']}; nothing was changed (raise --max-steps or "
                      "--time-budget to train further)", file=sys.stderr)
            return runs.summary(prepared["checkpoint"]["state"], parameters, world_size, args.accumulate)
        model, data = prepared["model"], prepared["data"]
        amp = prepared["amp"]
        if rank == 0 and announce:
            print(f"precision: {amp or 'float32'} (--amp {args.amp})", file=sys.stderr)
        if world_size > 1:
            torch.manual_seed(args.seed + rank)    # the same initial weights, but each rank its own dropout masks
        settings = dict(scheduler=prepared["scheduler"], device=device, max_steps=args.max_steps,
                        time_budget_s=args.time_budget, amp_dtype=amp, progress=not args.no_progress,
                        accumulate=args.accumulate, log_every=LOG_EVERY, validate=prepared["validate"],
                        validate_every=args.validate_every if prepared["validate"] else None)
        if args.compile:
            model.compile(dynamic=True)     # in place: parameter names, and so checkpoints, stay the same
        trainer = (DistributedTrainer if context else Trainer)(
            model, prepared["loss_fn"], prepared["optimizer"], lambda epoch: data.batches(epoch, seed=args.seed),
            **settings)
        if prepared["checkpoint"] is not None:
            runs.apply_checkpoint(checkpoint_path, prepared["checkpoint"], trainer.restore)
            if rank == 0 and announce:
                print(f"resuming {checkpoint_path} at step {trainer.state.step}", file=sys.stderr)
        if context:     # every rank joins in each checkpoint (random states); rank 0 writes it
            save = lambda t: save_on_rank_zero(t, checkpoint_path)   # noqa: E731
            trainer.add_callback("on_batch_end", distributed_checkpoint_callback(checkpoint_path, args.checkpoint_every))
        else:
            save = lambda t: save_checkpoint(checkpoint_path, t.checkpoint())   # noqa: E731
            trainer.add_callback("on_batch_end", checkpoint_callback(checkpoint_path, args.checkpoint_every))
        trainer.add_callback("on_batch_end", _stop_callback(signals, save, context))
        trainer.add_callback("on_train_end", save)
        signals.phase = "training"
        try:
            state = trainer.fit()
        finally:
            signals.phase = "finishing"
        summary = {**runs.summary(vars(state), parameters, world_size, args.accumulate), "amp": amp or "float32"}
        if rank == 0:
            runs.write_json(args.run / runs.HISTORY, summary)
    return summary


# --- translate and evaluate ------------------------------------------------------------------------

def load_run(run: str | Path, device=None):
    """The trained model (in eval mode) and tokenizer of a run folder, after checking that its files
    exist, are intact and belong together (`runs.load_run` on the device `device` names)."""
    return runs.load_run(Path(run), resolve_device(device))


def _load_for_decoding(args):
    from transformer_lib.decoding import compile_for_decoding
    model, tokenizer = load_run(args.run, args.device)
    return (compile_for_decoding(model) if args.compile else model), tokenizer, runs.read_config(args.run)[0]


def _check_source_lengths(tokenizer, sentences: list[str], labels: list[str], max_len: int) -> None:
    """RunError if a source has more tokens than the model's positional table holds."""
    for label, ids in zip(labels, tokenizer.encode_batch(sentences, unknown="replace")):
        if len(ids) > max_len:
            raise RunError(f"{label} has {len(ids)} tokens (with <s> and </s>), but this model reads at most "
                           f"max_len={max_len}; split it into shorter sentences")


def _input_lines(args) -> tuple[list[str], list[str]]:
    """The sentences to translate, one per argument or per line of stdin (a blank one included), and
    a label for each (for messages). stdin is read as UTF-8 bytes; \\n, \\r\\n and \\r end a line."""
    if args.sentences:
        for i, text in enumerate(args.sentences, start=1):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:     # bytes that are not UTF-8 reach argv as lone surrogates
                raise RunError(f"sentence argument {i} is not valid UTF-8 text; pass UTF-8 (e.g. convert it with "
                               "iconv -t utf-8)") from None
        return list(args.sentences), [f"sentence argument {i}" for i in range(1, len(args.sentences) + 1)]
    data = sys.stdin.buffer.read().replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()                 # the newline that ends the last line
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8").removeprefix("\ufeff" if number == 1 else ""))
        except UnicodeDecodeError as error:
            raise RunError(f"line {number} of stdin is not UTF-8 ({error.reason} at byte {error.start + 1} of the "
                           "line); re-encode the input, e.g. with iconv -f latin1 -t utf-8") from None
    return lines, [f"line {i} of stdin" for i in range(1, len(lines) + 1)]


def translate_command(args) -> list[str]:
    """One translation per input sentence, in order; a blank input gives a blank output."""
    from transformer_lib.evaluation import translate
    model, tokenizer, meta = _load_for_decoding(args)
    lines, labels = _input_lines(args)
    keep = [i for i, line in enumerate(lines) if line.strip()]
    _check_source_lengths(tokenizer, [lines[i] for i in keep], [labels[i] for i in keep], meta["model"]["max_len"])
    outputs = [""] * len(lines)
    for i, translation in zip(keep, translate(model, tokenizer, [lines[i] for i in keep], beam_size=args.beam,
                                              alpha=args.alpha)):
        outputs[i] = translation
    return outputs


def evaluate_command(args) -> dict:
    from transformer_lib.data import BUILTIN_SPLITS, MULTI30K_SPLITS, load_pairs
    from transformer_lib.evaluation import score_translations, translate
    if args.output is not None:      # refused now, not after the whole decode
        runs.check_writable(args.output, "--output", folder=False)
        runs.check_not_a_run_file(args.output, "--output")
    model, tokenizer, meta = _load_for_decoding(args)
    splits = {"builtin": BUILTIN_SPLITS, "multi30k": tuple(MULTI30K_SPLITS), "opus_books": ()}[meta["data"]]
    if args.split not in splits:
        raise RunError(f"--split {args.split}: the run's corpus {meta['data']} has "
                       + (f"the test splits {', '.join(s for s in splits if s not in ('train', 'valid'))}"
                          if splits else "no test split (the Hub publishes train only)"))
    _check_data_dir(meta["data"], args.data_dir)
    data_dir = args.data_dir or (meta.get("data_dir") if meta["data"] == "multi30k" else None)
    pairs = load_pairs(meta["data"], args.split, meta.get("src_lang"), meta.get("tgt_lang"), data_dir, limit=args.limit)
    _check_source_lengths(tokenizer, [s for s, _ in pairs], [f"sentence {i} of {args.split}" for i in
                                                             range(1, len(pairs) + 1)], meta["model"]["max_len"])
    start = time.perf_counter()
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs], beam_size=args.beam, alpha=args.alpha)
    metrics = score_translations(hypotheses, [t for _, t in pairs])
    metrics.update(split=args.split, sentences=len(pairs), beam=args.beam,
                   decode_seconds=round(time.perf_counter() - start, 1))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        runs.write_json(args.output, {"metrics": metrics, "translations": [
            {"source": s, "reference": t, "hypothesis": h} for (s, t), h in zip(pairs, hypotheses)]})
    return metrics


# --- main ------------------------------------------------------------------------------------------

def _is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or (
        isinstance(error, RuntimeError) and ("can't allocate memory" in str(error) or "out of memory" in str(error)))


def _write_stdout(text: str) -> None:
    """Write `text` as UTF-8 whatever the locale says (translations hold non-ASCII letters)."""
    sys.stdout.flush()
    if hasattr(sys.stdout, "buffer"):
        sys.stdout.buffer.write(text.encode("utf-8"))
        sys.stdout.buffer.flush()
    else:               # a notebook's stdout has no byte layer
        sys.stdout.write(text)


def main(argv: list[str] | None = None) -> int:
    """Run one command; a problem the user can fix is one `error: ...` line on stderr and exit code 2.
    Under torchrun, rank 0 prints it (and the summary); the other ranks exit quietly with code 2."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:     # `torchrun -m transformer_lib -- train --run R` (torchrun would read --run as its own)
        argv = argv[1:]
    args = build_parser().parse_args(argv)   # exits with code 2 and a usage line on a bad argument
    try:
        if args.command == "train":
            summary = train_command(args)
            output = (json.dumps({k: v for k, v in summary.items() if k != "history"}) + "\n"
                      if _is_main_process() else None)
        elif args.command == "translate":
            output = "".join(line + "\n" for line in translate_command(args))
        else:
            output = json.dumps(evaluate_command(args)) + "\n"
        if output is not None:
            _write_stdout(output)
    except _Stopped as stop:
        if _is_main_process():
            again = shlex.join(["python", "-m", "transformer_lib", *argv])
            print(stop.message(args.run, again), file=sys.stderr)
        return 128 + stop.signum
    except KeyboardInterrupt:
        if _is_main_process():
            print("interrupted; nothing was written", file=sys.stderr)
        return 128 + signal.SIGINT
    except (RunError, ValueError, TypeError, OSError, FloatingPointError, RuntimeError, MemoryError) as error:
        if isinstance(error, RuntimeError) and not _is_out_of_memory(error):
            raise
        message = (f"out of memory ({one_line(error)[:120]}); lower --max-tokens or --beam, or train a smaller model"
                   if _is_out_of_memory(error) else one_line(error))
        if _is_main_process():
            print(f"error: {message}", file=sys.stderr)
        elif _OWN_ERRORS["speak"]:
            print(f"error: (rank {os.environ['RANK']}) {message}", file=sys.stderr)
        return 2
    finally:
        if "transformer_lib.distributed" in sys.modules:    # leave torchrun's process group, if joined
            sys.modules["transformer_lib.distributed"].teardown_distributed()
    return 0
