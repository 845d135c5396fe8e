"""Command line for the course: `python -m transformer_lib {train,translate,evaluate} --help`.

Hand-written (no notebook is its home): it wires the notebooks' exported pieces together, the
same code the notebooks run. A run folder holds config.json, tokenizer.json, checkpoint.pt
(resumable; written atomically) and history.json.

Data-parallel training: `torchrun --standalone --nproc_per_node=N -m transformer_lib -- train --run R ...`
starts N processes that train one model together (DistributedDataParallel; gloo on the CPU, NCCL
on GPUs): rank 0 checks everything and writes the run folder while the others wait, then every
update averages the gradients of N batches, as one process with `--accumulate N` does. (The `--`
keeps torchrun from taking `--run` for an abbreviation of its own `--run-path`.)

A run folder is never left half-written or inconsistent: `train` checks every argument, the data
and any existing run before it writes anything, and refuses to resume a run with another model
configuration. Every problem (bad argument, damaged file, files that do not belong together) is
answered with one `error: ...` line and exit code 2.
"""
import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

# torch and the course's modules are imported inside the commands, after argparse has checked the
# arguments: a mistyped option is answered at once instead of after torch's seconds of import.


class RunError(Exception):
    """A problem with the arguments or the run folder that the user can fix; main prints it as one line."""


def _checked_number(kind: type, ok, wanted: str):
    """An argparse `type` that parses `kind` and accepts finite values where `ok(value)` holds."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value
    return parse


positive_int = _checked_number(int, lambda v: v > 0, "a positive integer")
nonnegative_int = _checked_number(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _checked_number(float, lambda v: v > 0, "a finite number > 0")
nonnegative_float = _checked_number(float, lambda v: v >= 0, "a finite number >= 0")
probability = _checked_number(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
sequence_length = _checked_number(int, lambda v: v >= 2, "an integer >= 2 (<s> and </s> included)")


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
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use cpu, cuda, cuda:N or mps")
    return text


def _is_main_process() -> bool:
    """False in the processes that torchrun starts besides rank 0: they keep quiet about errors."""
    return os.environ.get("RANK", "0") == "0"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is answered with one line, not the whole usage text (by rank 0 only)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n" if _is_main_process() else None)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m transformer_lib", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model; resumes if the run folder has a checkpoint",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    train.add_argument("--run", type=Path, required=True, help="run folder for checkpoint, tokenizer, config, history")
    train.add_argument("--data", default="builtin", choices=["builtin", "multi30k", "opus_books"], help="corpus")
    train.add_argument("--data-dir", default=None, help="local Multi30k folder (default: $MULTI30K_DIR, else the Hub)")
    train.add_argument("--src-lang", default=None, help="source language (multi30k: de, opus_books: en)")
    train.add_argument("--tgt-lang", default=None, help="target language (multi30k: en, opus_books: it)")
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
    train.add_argument("--seed", type=int, default=0, help="random seed (data order, init, dropout)")
    train.add_argument("--device", type=device_name, default=None, help="cuda, mps or cpu (default: the best present)")
    train.add_argument("--amp", default=None, choices=["bf16", "fp16"],
                       help="mixed precision: bf16 on CUDA or on a CPU with bf16 instructions, fp16 on CUDA only")
    train.add_argument("--threads", type=positive_int, default=None, help="CPU threads for torch")
    train.add_argument("--compile", action="store_true", help="torch.compile the model (minutes up front; pays on GPUs)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    for name, text in (("translate", "translate sentences (arguments, or one per line on stdin)"),
                       ("evaluate", "score a trained model on a test split with sacreBLEU")):
        sub = commands.add_parser(name, help=text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        sub.add_argument("--run", type=Path, required=True, help="run folder written by `train`")
        sub.add_argument("--beam", type=positive_int, default=1, help="beam size (1 = greedy)")
        sub.add_argument("--alpha", type=nonnegative_float, default=0.6, help="length penalty α for beam search")
        sub.add_argument("--device", type=device_name, default=None, help="cuda, mps or cpu (default: the best present)")
        sub.add_argument("--compile", action="store_true", help="torch.compile encode and decode (pays on large test sets)")
        if name == "translate":
            sub.add_argument("sentences", nargs="*", help="source sentences (default: read stdin)")
        else:
            sub.add_argument("--split", default="test", help="split to score (multi30k: test_2016, test_2017)")
            sub.add_argument("--data-dir", default=None, help="local Multi30k folder")
            sub.add_argument("--limit", type=nonnegative_int, default=None, help="score only the first N sentences")
            sub.add_argument("--output", type=Path, default=None, help="write metrics and translations to this JSON")
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


# Corpus languages when --src-lang/--tgt-lang are left out (as in load_pairs), so "de" and None compare equal.
DEFAULT_LANGS = {"builtin": (None, None), "multi30k": ("de", "en"), "opus_books": ("en", "it")}
# The option that sets each model field, for messages.
OPTION_OF_FIELD = {"d_model": "--d-model", "n_heads": "--heads", "d_ff": "--d-ff", "n_encoder_layers": "--layers",
                   "n_decoder_layers": "--layers", "dropout": "--dropout", "norm_first": "--post-ln",
                   "max_len": "--max-len", "src_vocab_size": "--vocab-size", "tgt_vocab_size": "--vocab-size",
                   "vocab_size": "--vocab-size", "data": "--data", "src_lang": "--src-lang", "tgt_lang": "--tgt-lang",
                   "attention_dropout": "--attention-dropout", "activation_dropout": "--activation-dropout"}


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _write_atomic(path: Path, write) -> None:
    """`write(temporary path)`, then rename onto `path`: readers see the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _run_meta(args, config, world_size: int = 1) -> dict:
    """What config.json records: the model's configuration, what the tokenizer was trained on, and
    how an update is made (processes × batches accumulated per process)."""
    src_lang, tgt_lang = DEFAULT_LANGS[args.data]
    return {"model": asdict(config), "data": args.data, "src_lang": args.src_lang or src_lang,
            "tgt_lang": args.tgt_lang or tgt_lang, "data_dir": args.data_dir, "vocab_size": args.vocab_size,
            "processes": world_size, "accumulate": args.accumulate}


def read_run_config(run: Path):
    """(config.json as a dict, its TransformerConfig); RunError naming the file if it is not a run's."""
    from transformer_lib.model import TransformerConfig
    path = run / "config.json"
    if not path.is_file():
        raise RunError(f"{path} is missing; train first: python -m transformer_lib train --run {run}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunError(f"{path} is not valid JSON ({_one_line(error)}); restore it from the run that wrote it, "
                       "or train into a new --run folder") from None
    try:
        return meta, TransformerConfig(**meta["model"])
    except (TypeError, KeyError) as error:
        raise RunError(f"{path} holds no model configuration that this version reads ({_one_line(error)}); "
                       "train into a new --run folder") from None


def load_tokenizer(run: Path, config):
    """The run's tokenizer, checked against config.json's vocabulary."""
    from transformer_lib.tokenization import SubwordTokenizer
    path = run / "tokenizer.json"
    if not path.is_file():
        raise RunError(f"{path} is missing; train first: python -m transformer_lib train --run {run}")
    try:
        tokenizer = SubwordTokenizer.load(path)
    except Exception as error:   # the tokenizers library raises a bare Exception for a damaged file
        raise RunError(f"{path} is not a readable tokenizer ({_one_line(error)}); restore it from the run that "
                       "wrote it, or train into a new --run folder") from None
    if (tokenizer.vocab_size, tokenizer.pad_id) != (config.src_vocab_size, config.pad_id) \
            or config.tgt_vocab_size != config.src_vocab_size:
        raise RunError(f"{path} ({tokenizer.vocab_size} tokens, padding id {tokenizer.pad_id}) and "
                       f"{run / 'config.json'} (src_vocab_size={config.src_vocab_size}, "
                       f"tgt_vocab_size={config.tgt_vocab_size}, pad_id={config.pad_id}) disagree on the vocabulary: "
                       "they come from different runs; keep the files of one run together")
    return tokenizer


def restore_from_checkpoint(path: Path, apply, device) -> dict:
    """Read the checkpoint at `path` and `apply(checkpoint)` (load the weights); RunError naming the
    file when it is damaged or its weights do not fit config.json. Returns the checkpoint."""
    from transformer_lib.training import load_checkpoint
    try:
        checkpoint = load_checkpoint(path, map_location=device)
    except (FileNotFoundError, PermissionError):
        raise
    except Exception as error:   # a damaged file: EOFError, RuntimeError, UnpicklingError, ... from torch.load
        raise RunError(f"{path} is empty, truncated or not a checkpoint ({_one_line(error)}); restore it from a "
                       "backup, or delete it to train from scratch") from None
    apply_checkpoint(path, checkpoint, apply)
    return checkpoint


def apply_checkpoint(path: Path, checkpoint, apply) -> None:
    """`apply(checkpoint)`, read from `path`; RunError when it does not fit the run's config.json."""
    try:
        if not isinstance(checkpoint, dict) or "model" not in checkpoint:
            raise KeyError("no 'model' weights in it")
        apply(checkpoint)
    except (RuntimeError, KeyError, ValueError, TypeError) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        detail = (lines[1] if len(lines) > 1 else " ".join(lines))[:300]
        raise RunError(f"the weights in {path} do not fit {path.parent / 'config.json'} ({detail}); the files "
                       "come from different runs: keep the files of one run together") from None


def check_same_updates(run: Path, old: dict, new: dict) -> None:
    """RunError when a run is resumed with another number of processes or --accumulate: its updates
    would average other batches, and its random states would not match (runs written before these
    were recorded count as 1 × 1)."""
    was, now = (old.get("processes", 1), old.get("accumulate", 1)), (new["processes"], new["accumulate"])
    if was != now:
        raise RunError(f"{run} was trained with {was[0]} process(es) × --accumulate {was[1]}, this launch has "
                       f"{now[0]} × --accumulate {now[1]}, so it is left as it was; resume it with "
                       f"torchrun --nproc_per_node={was[0]} (or without torchrun for 1) and --accumulate {was[1]}, "
                       "or train into a new --run folder")


def check_same_run(run: Path, old: dict, new: dict) -> None:
    """RunError naming every setting in which `new` differs from the existing run's config.json `old`."""
    def settings(meta: dict) -> dict:
        src_lang, tgt_lang = DEFAULT_LANGS.get(meta.get("data"), (None, None))
        return {**meta.get("model", {}), "data": meta.get("data"), "src_lang": meta.get("src_lang") or src_lang,
                "tgt_lang": meta.get("tgt_lang") or tgt_lang, "vocab_size": meta.get("vocab_size")}
    was, now = settings(old), settings(new)
    if was["vocab_size"] is None:          # a run written before the asked vocabulary size was recorded
        now["vocab_size"] = None
    differ = [f"{key} {was.get(key)} -> {now.get(key)} ({OPTION_OF_FIELD.get(key, 'not an option')})"
              for key in sorted(was.keys() | now.keys()) if was.get(key) != now.get(key)]
    if differ:
        raise RunError(f"{run} was trained with another configuration, so it is left as it was: {'; '.join(differ)}. "
                       f"Resume it with its own settings (see {run / 'config.json'}) or train into a new --run folder")


LOG_EVERY = 10    # steps between the mean losses logged in history.json


def _config_from_args(args, vocab_size: int, pad_id: int):
    from transformer_lib.model import TransformerConfig
    return TransformerConfig(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=args.d_model,
                             n_heads=args.heads, d_ff=args.d_ff, n_encoder_layers=args.layers,
                             n_decoder_layers=args.layers, dropout=args.dropout, norm_first=not args.post_ln,
                             max_len=args.max_len, pad_id=pad_id, attention_dropout=args.attention_dropout,
                             activation_dropout=args.activation_dropout)


class _RankZeroRefused(RunError):
    """Raised on the other ranks when rank 0 refused the command (rank 0 prints the reason)."""


# Set on a rank other than 0 once rank 0 has accepted the command: an error from then on is this
# rank's own, and it says so (before, its errors are the same as rank 0's, which prints them).
_OWN_ERRORS = {"speak": False}


def _prepare_run(args, device, world_size: int, write: bool) -> dict:
    """Check the arguments, data and any existing run, and build the model, data and optimizer; with
    `write`, then write the run folder of a new run. Rank 0 calls it with write=True before the
    other ranks, which then find the run folder and read its tokenizer."""
    from transformer_lib.data import TranslationData, load_pairs
    from transformer_lib.model import build_transformer
    from transformer_lib.tokenization import train_bpe_tokenizer
    from transformer_lib.training import (LabelSmoothingLoss, load_weights, make_optimizer, translation_loss,
                                          validation_loss)
    run = args.run
    existing = run / "config.json"
    if not existing.is_file() and any((run / name).exists() for name in ("tokenizer.json", "checkpoint.pt")):
        raise RunError(f"{run} has a tokenizer or checkpoint but no config.json, so it cannot be resumed safely; "
                       "delete the folder or train into a new --run folder")
    old_meta, old_config = read_run_config(run) if existing.is_file() else (None, None)

    train_pairs = load_pairs(args.data, "train", src_lang=args.src_lang, tgt_lang=args.tgt_lang,
                             data_dir=args.data_dir)
    if old_meta is not None:
        tokenizer = load_tokenizer(run, old_config)
    else:
        tokenizer = train_bpe_tokenizer([s for pair in train_pairs for s in pair], vocab_size=args.vocab_size)
    config = _config_from_args(args, tokenizer.vocab_size, tokenizer.pad_id)
    meta = _run_meta(args, config, world_size)
    if old_meta is not None:
        check_same_run(run, old_meta, meta)
        check_same_updates(run, old_meta, meta)
    model = build_transformer(config).to(device)
    data = TranslationData(train_pairs, tokenizer, args.max_tokens, max_len=config.max_len)
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
        valid_batches = TranslationData(valid_pairs, tokenizer, args.max_tokens, max_len=config.max_len).batches(
            0, shuffle=False)
        validate = lambda m: validation_loss(m, valid_batches, loss_fn)   # noqa: E731
    checkpoint_path, checkpoint = run / "checkpoint.pt", None
    if checkpoint_path.is_file():     # read (and fit to the model) now, so a bad file is refused before anything runs
        checkpoint = restore_from_checkpoint(checkpoint_path, lambda c: load_weights(model, c["model"]), device)

    # Everything checked: only now is the run folder written (config.json last, so its presence
    # means the tokenizer is there too).
    if write and old_meta is None:
        run.mkdir(parents=True, exist_ok=True)
        _write_atomic(run / "tokenizer.json", tokenizer.save)
        _write_atomic(run / "config.json", lambda p: p.write_text(json.dumps(meta, indent=2), encoding="utf-8"))
    return {"model": model, "data": data, "optimizer": optimizer, "scheduler": scheduler,
            "loss_fn": loss_fn, "validate": validate, "checkpoint": checkpoint}


def _prepare_in_turn(args, device, context) -> dict:
    """`_prepare_run` on rank 0 first (it writes the run folder), then on the other ranks, which wait
    for rank 0's verdict: when it refuses, every rank stops (rank 0 alone prints the reason)."""
    import torch.distributed as dist
    if context is None:
        return _prepare_run(args, device, 1, write=True)
    verdict = [None]
    if context.rank == 0:
        try:
            prepared = _prepare_run(args, device, context.world_size, write=True)
        except (RunError, ValueError, TypeError, OSError) as error:
            verdict = [_one_line(error)]
            dist.broadcast_object_list(verdict, src=0)
            raise
        dist.broadcast_object_list(verdict, src=0)
        return prepared
    dist.broadcast_object_list(verdict, src=0)      # waits until rank 0 has checked and written the run
    if verdict[0] is not None:
        raise _RankZeroRefused(verdict[0])
    _OWN_ERRORS["speak"] = True
    return _prepare_run(args, device, context.world_size, write=False)


def train_command(args) -> dict:
    """Train (or resume) a run; return its summary. Everything is checked before the run folder is
    written, so a refused command leaves it as it was. Under torchrun, every process runs this."""
    import torch
    from transformer_lib.distributed import (DistributedTrainer, distributed_checkpoint_callback,
                                             launched_by_torchrun, save_on_rank_zero, setup_distributed)
    from transformer_lib.training import Trainer, checkpoint_callback, save_checkpoint
    device = resolve_device(args.device)
    if args.amp == "fp16" and device.type != "cuda" or args.amp == "bf16" and device.type not in ("cuda", "cpu"):
        raise RunError(f"--amp {args.amp} does not run on {device.type}; fp16 needs CUDA, bf16 CUDA or the CPU")
    if args.max_steps is None and args.time_budget is None:
        raise RunError("give --max-steps or --time-budget (or both), or training never stops")
    if args.validate_every % LOG_EVERY:
        raise RunError(f"--validate-every must be a multiple of {LOG_EVERY} (the steps between logged losses), "
                       f"got {args.validate_every}")
    if args.threads:
        torch.set_num_threads(args.threads)
    context = setup_distributed(device) if launched_by_torchrun() else None
    device, rank, world_size = (context.device, context.rank, context.world_size) if context else (device, 0, 1)
    torch.manual_seed(args.seed)
    prepared = _prepare_in_turn(args, device, context)
    if world_size > 1:
        torch.manual_seed(args.seed + rank)    # the same initial weights, but each rank its own dropout masks
    settings = dict(scheduler=prepared["scheduler"], device=device, max_steps=args.max_steps,
                    time_budget_s=args.time_budget, amp_dtype=args.amp, progress=not args.no_progress,
                    accumulate=args.accumulate, log_every=LOG_EVERY, validate=prepared["validate"],
                    validate_every=args.validate_every if prepared["validate"] else None)
    model, data = prepared["model"], prepared["data"]
    if args.compile:
        model.compile(dynamic=True)     # in place: parameter names, and so checkpoints, stay the same
    trainer = (DistributedTrainer if context else Trainer)(
        model, prepared["loss_fn"], prepared["optimizer"], lambda epoch: data.batches(epoch, seed=args.seed), **settings)
    checkpoint_path = args.run / "checkpoint.pt"
    if prepared["checkpoint"] is not None:
        apply_checkpoint(checkpoint_path, prepared["checkpoint"], trainer.restore)
        if rank == 0:
            print(f"resuming {checkpoint_path} at step {trainer.state.step}", file=sys.stderr)
    if context:     # every rank joins in each checkpoint (random states); rank 0 writes it
        trainer.add_callback("on_batch_end", distributed_checkpoint_callback(checkpoint_path, args.checkpoint_every))
        trainer.add_callback("on_train_end", lambda t: save_on_rank_zero(t, checkpoint_path))
    else:
        trainer.add_callback("on_batch_end", checkpoint_callback(checkpoint_path, args.checkpoint_every))
        trainer.add_callback("on_train_end", lambda t: save_checkpoint(checkpoint_path, t.checkpoint()))
    state = trainer.fit()
    summary = {"steps": state.step, "epochs_started": state.epoch + 1, "train_seconds": round(state.elapsed, 1),
               "parameters": sum(p.numel() for p in model.parameters()), "processes": world_size,
               "accumulate": args.accumulate, "history": state.history}
    if rank == 0:
        _write_atomic(args.run / "history.json", lambda p: p.write_text(json.dumps(summary, indent=1), encoding="utf-8"))
    return summary


def load_run(run: Path, device=None):
    """The trained model (in eval mode) and tokenizer of a run folder, after checking that its files
    exist, are intact and belong together."""
    from transformer_lib.model import build_transformer
    from transformer_lib.training import load_weights
    run = Path(run)
    if not (run / "checkpoint.pt").is_file():
        raise RunError(f"{run / 'checkpoint.pt'} is missing; train first: python -m transformer_lib train --run {run}")
    device = resolve_device(device)
    _, config = read_run_config(run)
    tokenizer = load_tokenizer(run, config)
    model = build_transformer(config).to(device)
    restore_from_checkpoint(run / "checkpoint.pt", lambda checkpoint: load_weights(model, checkpoint["model"]), device)
    return model.eval(), tokenizer


def _check_source_lengths(tokenizer, sentences: list[str], max_len: int) -> None:
    """RunError if a source has more tokens than the model's positional table holds."""
    for i, ids in enumerate(tokenizer.encode_batch(sentences, unknown="replace")):
        if len(ids) > max_len:
            raise RunError(f"sentence {i + 1} has {len(ids)} tokens (with <s> and </s>), but this model reads at most "
                           f"max_len={max_len}; split it into shorter sentences")


def _load_for_decoding(args):
    from transformer_lib.decoding import compile_for_decoding
    model, tokenizer = load_run(args.run, args.device)
    return (compile_for_decoding(model) if args.compile else model), tokenizer


def translate_command(args) -> list[str]:
    from transformer_lib.evaluation import translate
    model, tokenizer = _load_for_decoding(args)
    sentences = args.sentences or [line.strip() for line in sys.stdin if line.strip()]
    _check_source_lengths(tokenizer, sentences, read_run_config(args.run)[1].max_len)
    return translate(model, tokenizer, sentences, beam_size=args.beam, alpha=args.alpha)


def evaluate_command(args) -> dict:
    from transformer_lib.data import load_pairs
    from transformer_lib.evaluation import score_translations, translate
    model, tokenizer = _load_for_decoding(args)
    meta, config = read_run_config(args.run)
    pairs = load_pairs(meta["data"], args.split, meta.get("src_lang"), meta.get("tgt_lang"),
                       args.data_dir or meta.get("data_dir"), limit=args.limit)
    _check_source_lengths(tokenizer, [s for s, _ in pairs], config.max_len)
    start = time.perf_counter()
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs], beam_size=args.beam, alpha=args.alpha)
    metrics = score_translations(hypotheses, [t for _, t in pairs])
    metrics.update(split=args.split, sentences=len(pairs), beam=args.beam,
                   decode_seconds=round(time.perf_counter() - start, 1))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"metrics": metrics, "translations": [
            {"source": s, "reference": t, "hypothesis": h} for (s, t), h in zip(pairs, hypotheses)]}, indent=1,
            ensure_ascii=False), encoding="utf-8")
    return metrics


# The course's model of the built-in corpus: trained by notebook 11, used by notebooks 12 and 13.
COURSE_MODEL_ARGS = ["--data", "builtin", "--vocab-size", "1000", "--d-model", "128", "--heads", "4",
                     "--d-ff", "512", "--layers", "2", "--max-tokens", "2048", "--warmup", "200",
                     "--lr-factor", "0.7", "--max-steps", "300", "--seed", "0"]


def course_model(run: str | Path, device=None):
    """Load the course model from `run`, training it first (same settings every time) if absent.

    Equivalent to `python -m transformer_lib train --run RUN` with COURSE_MODEL_ARGS.
    """
    run = Path(run)
    if not (run / "checkpoint.pt").is_file() or not (run / "history.json").is_file():
        train_command(build_parser().parse_args(["train", "--run", str(run), "--no-progress", *COURSE_MODEL_ARGS]))
    return load_run(run, device)


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
            if _is_main_process():
                print(json.dumps({k: v for k, v in summary.items() if k != "history"}))
        elif args.command == "translate":
            print("\n".join(translate_command(args)))
        else:
            print(json.dumps(evaluate_command(args)))
    except (RunError, ValueError, TypeError, OSError, FloatingPointError) as error:
        if _is_main_process():
            print(f"error: {_one_line(error)}", file=sys.stderr)
        elif _OWN_ERRORS["speak"]:
            print(f"error: (rank {os.environ['RANK']}) {_one_line(error)}", file=sys.stderr)
        return 2
    finally:
        if "transformer_lib.distributed" in sys.modules:    # leave torchrun's process group, if joined
            sys.modules["transformer_lib.distributed"].teardown_distributed()
    return 0
