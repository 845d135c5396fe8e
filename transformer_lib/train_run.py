"""Train a run folder from `TrainSettings`: the one library call behind `python -m transformer_lib
train`, `course_model`, the notebooks and the benchmark scripts.

Hand-written, not exported: the text side (corpus, tokenization, data, training) and the model side
(model) meet here, as they do in decoding, evaluation and the command line, so no notebook is its
home. `train_run(run, settings)` checks everything before it writes anything (a refused call leaves
the folder as it was), trains (or resumes) under the folder's lock, and returns the summary.

Data-parallel training: under `torchrun`, every process calls `train_run`: rank 0 checks and writes
the run folder while the others wait, then every update averages the gradients of N batches.
Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint there and raises
`TrainingStopped`, which says what was kept and how to resume.
"""
import contextlib
import dataclasses
import sys
import time
import uuid

from transformer_lib import runs
from transformer_lib.data_files import check_source_files, header_warning
from transformer_lib.recipe import Averaging, build_model, check_average, launch_attention, recorded_attention
from transformer_lib.run_config import check_data_dir
from transformer_lib.runs import RunError, RunFolder, one_line
from transformer_lib.settings import LOG_EVERY, TrainSettings
from transformer_lib.train_device import launch_amp, resolve_amp, resolve_device  # noqa: F401
from transformer_lib.train_signals import Signals, TrainingStopped, stop_callback  # noqa: F401
from transformer_lib.train_report import (Progress, data_lines, data_option, dropped_pairs, end_lines,
                                          last_valid_loss, model_line, where_in_file)


def check_settings(settings: TrainSettings, device) -> None:
    """RunError for settings that contradict each other or this machine (before any work)."""
    s = settings
    if s.amp == "fp16" and device.type != "cuda" or s.amp == "bf16" and device.type not in ("cuda", "cpu"):
        raise RunError(f"--amp {s.amp} does not run on {device.type}; fp16 needs CUDA, bf16 CUDA or the CPU")
    if s.max_steps is None and s.time_budget is None:
        raise RunError("give --max-steps or --time-budget (or both), or training never stops")
    check_data_dir(s.source.kind, s.data_dir)      # TrainSettings checked the rest of the data options


class RankZeroRefused(RunError):
    """Raised on the other ranks when rank 0 refused the call (rank 0 prints the reason)."""


# Set on a rank other than 0 once rank 0 has accepted the call: an error from then on is this
# rank's own, and it says so (before, its errors are the same as rank 0's, which prints them).
OWN_ERRORS = {"speak": False}


# --- preparing ---------------------------------------------------------------------------------------

def _model_config(s: TrainSettings, vocab_size: int, pad_id: int):
    from transformer_lib.model import TransformerConfig
    return TransformerConfig(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=s.d_model,
                             n_heads=s.heads, d_ff=s.d_ff, n_encoder_layers=s.layers, n_decoder_layers=s.layers,
                             dropout=s.dropout, norm_first=not s.post_ln, max_len=s.max_len, pad_id=pad_id,
                             attention_dropout=s.attention_dropout, activation_dropout=s.activation_dropout)


def _meta(s: TrainSettings, source, config, processes: int, tokenizer_fingerprint: str = "", prints=None) -> dict:
    prints = prints or {}
    return runs.new_config(config, source.kind, s.src_lang, s.tgt_lang, s.data_dir, s.vocab_size, processes,
                           s.accumulate, s.recorded(), tokenizer_fingerprint, prints.get("train", {}), s.batch_multiple,
                           source=_recorded_source(source), split_prints={k: v for k, v in prints.items() if k != "train"})


def _source_of(s: TrainSettings, old_meta: dict | None):
    """The data source this launch reads: the settings' one; for a run begun before runs recorded their
    source, opus_books as it was read then (all of it for training, nothing carved); for a run begun when
    a test split was carved beside a given --valid, its recorded --test-fraction (unless one is given)."""
    if old_meta is not None and "source" not in old_meta and s.source.kind == "opus_books":
        return dataclasses.replace(s.source, valid_fraction=0, test_fraction=0)
    recorded = (old_meta or {}).get("source") or {}
    if s.test_fraction is None and recorded.get("test_fraction", s.source.test_fraction) != s.source.test_fraction:
        return dataclasses.replace(s.source, test_fraction=recorded["test_fraction"])
    return s.source


def _recorded_source(source) -> dict:
    """The source as config.json records it: its files as absolute paths, so that `evaluate --run` finds
    them from any working folder."""
    import os
    record = source.to_dict()
    for split in ("train", "valid", "test"):
        where = record.get(split)
        if source.kind in ("files", "tsv", "csv") and where is not None:
            record[split] = [os.path.abspath(p) for p in where] if isinstance(where, tuple) else os.path.abspath(where)
    return record


def _prepare(folder: RunFolder, s: TrainSettings, device, processes: int, write: bool, pipes=None) -> dict:
    """Check the run folder, data and settings; build the model, data and optimizer; with `write`,
    then write tokenizer.json and config.json. A finished run returns at once ({"finished": why})."""
    from transformer_lib.data import TranslationData
    from transformer_lib.sources import read_source
    from transformer_lib.tokenization import train_bpe_tokenizer
    from transformer_lib.training import (LabelSmoothingLoss, load_weights, make_optimizer, translation_loss,
                                          validation_loss)
    old_meta, changes = None, []
    if folder.exists():
        folder.read(device, need_checkpoint=False)
        old_meta, tokenizer = folder.meta, folder.tokenizer
        config = _model_config(s, tokenizer.vocab_size, tokenizer.pad_id)
        changes = runs.check_same_run(folder.path, old_meta, _meta(s, _source_of(s, old_meta), config, processes))
        model = build_model(config, s.init, device)
        if folder.checkpoint is not None:   # fitted now, so a bad file is refused before anything runs
            runs.apply_checkpoint(folder.path / runs.CHECKPOINT, folder.checkpoint,
                                  lambda c: load_weights(model, c["model"]))
            finished = runs.finished_reason(folder.checkpoint["state"], s.max_steps, s.time_budget)
            if finished:
                return {"finished": finished, "model": model}
    else:
        runs.check_new_run_folder(folder.path)
    source = _source_of(s, old_meta)
    read = source if pipes is None else dataclasses.replace(      # pipes: through the ends opened to check them
        source, **{split: getattr(pipes.source, split) for split in ("train", "valid", "test")})
    try:
        splits = read_source(read)      # a malformed file: ValueError naming it, its line and the fix
    except (ValueError, OSError) as error:
        if "too few to carve" not in str(error):
            raise (pipes.user_names(error) if pipes else error) from None
        raise RunError(f"{one_line(error)} (--valid-fraction, --test-fraction; --valid, --test)") from None
    finally:
        if pipes is not None:
            pipes.close()
    train_pairs, prints = splits.train, splits.fingerprint()
    check_average(s, splits.valid)
    if old_meta is not None:
        for split in ("train", "valid", "test"):
            runs.check_same_data(folder.path, old_meta, prints[split], data_option(s, split), split)
    else:
        tokenizer = train_bpe_tokenizer([text for pair in train_pairs for text in pair], vocab_size=s.vocab_size)
        tokenizer.fingerprint = runs.fingerprint_tokenizer(tokenizer.tokenizer.to_str())
        config = _model_config(s, tokenizer.vocab_size, tokenizer.pad_id)
        model = build_model(config, s.init, device)
    try:
        data = TranslationData(train_pairs, tokenizer, s.max_tokens, max_len=config.max_len,
                               pad_to_multiple=s.batch_multiple)
    except ValueError as error:
        if "max_tokens" not in str(error):
            raise
        raise RunError(f"--max-tokens {s.max_tokens}: {one_line(error)}") from None
    if not len(data):
        raise RunError(f"the length filter removed all {len(train_pairs)} training pairs: none fits in "
                       f"--max-len {config.max_len} tokens (<s> and </s> included); raise --max-len")
    dropped = {}
    if len(data) < len(train_pairs):
        first = dropped_pairs(train_pairs, tokenizer, config.max_len, s.batch_multiple)[0]
        dropped["train"] = (len(train_pairs) - len(data), where_in_file(source, splits, first))
    per_update = processes * s.accumulate
    if per_update > 1 and len(data.batches(0, seed=s.seed)) < per_update:
        raise RunError(f"an epoch has {len(data.batches(0, seed=s.seed))} batches, fewer than the {per_update} "
                       f"that one update takes ({processes} process(es) × --accumulate {s.accumulate}); "
                       "lower --max-tokens, --accumulate or the number of processes")
    optimizer, scheduler = make_optimizer(model, config.d_model, s.warmup, s.lr_factor, cooldown=s.cooldown)
    criterion = LabelSmoothingLoss(s.label_smoothing, ignore_index=tokenizer.pad_id)
    loss_fn = lambda m, b: translation_loss(m, b, criterion)   # noqa: E731
    validate = None
    if s.validate_every and splits.valid:       # given, or carved out of the training pairs
        valid_data = TranslationData(splits.valid, tokenizer, s.max_tokens, max_len=config.max_len,
                                     pad_to_multiple=s.batch_multiple)
        valid_batches = valid_data.batches(0, shuffle=False)
        if len(valid_data) < len(splits.valid):
            dropped["valid"] = (len(splits.valid) - len(valid_data), "not counted in the validation loss")
        validate = lambda m: validation_loss(m, valid_batches, loss_fn)   # noqa: E731
    amp = launch_amp(s, device, old_meta, model, data, loss_fn)
    attention = launch_attention(s, device, old_meta, model, data, loss_fn, amp)     # (path, what train says)
    meta = {**_meta(s, source, config, processes, tokenizer.fingerprint, prints),
            "run_id": (old_meta or {}).get("run_id") or uuid.uuid4().hex}
    if old_meta is not None:        # what an older run did not record is recorded now; what changed, with its step
        step = folder.checkpoint["state"]["step"] if folder.checkpoint else 0
        # The same pairs (their fingerprints were compared), perhaps from moved files: recorded where they are now.
        meta = {**meta, "format": old_meta.get("format", 1),
                "fingerprints": old_meta.get("fingerprints", meta["fingerprints"]),
                "changes": old_meta.get("changes", []) + [{"step": step, "change": c} for c in changes]}
    meta["amp"] = (old_meta or {}).get("amp") or amp or "float32"
    meta.update(recorded_attention(s, old_meta, attention[0]))
    if write and meta != old_meta:       # everything checked: only now is the folder written
        folder.start(meta, tokenizer if old_meta is None else None)
    folder.meta = meta
    return {"model": model, "data": data, "optimizer": optimizer, "scheduler": scheduler, "loss_fn": loss_fn,
            "validate": validate, "amp": amp, "changes": changes, "source": source, "splits": splits,
            "dropped": dropped, "vocabulary": tokenizer.vocab_size, "tokenizer": tokenizer, "attention": attention}


def _prepare_in_turn(folder: RunFolder, s: TrainSettings, device, context, resources) -> dict:
    """On rank 0 (or alone): lock the folder (held in `resources`) and `_prepare`; then on the other
    ranks, which wait for rank 0's verdict: when it refuses, every rank stops (rank 0 says why)."""
    import torch.distributed as dist

    def first() -> dict:
        runs.check_writable(folder.path, "--run", folder=True)
        holder = runs.lock_holder(folder.path)
        if holder:          # said before the data is read
            raise RunError(f"another train (pid {holder}) is writing {folder.path}, so it is left to that one; wait "
                           "for it to end (or stop it), or train into another --run folder")
        pipes = check_source_files(s.source)    # readable, and each named pipe has its writer: only then the lock
        try:
            resources.enter_context(folder.lock())
        except BaseException:
            pipes.close()
            raise
        try:
            return _prepare(folder, s, device, context.world_size if context else 1, write=True, pipes=pipes)
        finally:
            pipes.close()               # also when a finished run read no data
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
        raise RankZeroRefused(verdict[0])
    OWN_ERRORS["speak"] = True
    return _prepare(folder, s, device, context.world_size, write=False)


# --- training ---------------------------------------------------------------------------------------

def train_run(run, settings: TrainSettings, announce: bool = True) -> dict:
    """Train (or resume) the run folder `run` with `settings`; return its summary (with "amp", the
    precision it trained in, the pairs of each split and the last validation loss). Everything is checked
    before the folder is written, so a refused call leaves it as it was. `announce` says (on stderr) what
    was read, the model and precision, what changed on resume, the validation losses without a bar, and at
    the end where the run is and how to score it (course_model keeps the notebooks' output free of them)."""
    import torch
    from transformer_lib.device import keep_freed_memory
    from transformer_lib.distributed import DistributedTrainer, launched_by_torchrun, setup_distributed
    from transformer_lib.training import Trainer
    if not isinstance(settings, TrainSettings):
        raise TypeError(f"settings must be a TrainSettings, got {type(settings).__name__}; build one with "
                        "TrainSettings(d_model=..., max_steps=...)")
    s, folder, began = settings, RunFolder(run), time.perf_counter()
    runs.check_path_text(folder.path, "--run")
    device = resolve_device(s.device)
    check_settings(s, device)
    if s.threads:
        torch.set_num_threads(s.threads)
    if device.type == "cpu":
        keep_freed_memory()         # large blocks reused between steps, not mapped afresh (device.py says why)
    context = setup_distributed(device) if launched_by_torchrun() else None
    device, rank, world_size = (context.device, context.rank, context.world_size) if context else (device, 0, 1)
    say = (lambda text: print(text, file=sys.stderr)) if rank == 0 and announce else (lambda text: None)
    with contextlib.ExitStack() as resources:
        signals = resources.enter_context(Signals())
        torch.manual_seed(s.seed)
        prepared = _prepare_in_turn(folder, s, device, context, resources)
        model = prepared["model"]
        parameters = sum(p.numel() for p in model.parameters())
        launch_amp = folder.meta.get("amp", "float32") if "finished" in prepared else prepared["amp"] or "float32"
        pairs = {split: len(getattr(prepared["splits"], split)) for split in ("train", "valid", "test")} \
            if "splits" in prepared else None
        averaging = Averaging(s.average, s.average_every, folder.checkpoint)

        def done(state) -> dict:
            return {**runs.summary(state, parameters, world_size, s.accumulate), "amp": launch_amp,
                    **({"attention": folder.meta["attention"]} if "attention" in folder.meta else {}),
                    **({"pairs": pairs} if pairs else {}), **({"averaging": averaging.record} if averaging.record
                                                               else {}),
                    "valid_loss": (last_valid_loss(state.get("history", [])) or (None, None))[1]}
        if "finished" in prepared:
            say(f"{folder.path} is finished: {prepared['finished']}; nothing was changed (raise --max-steps or "
                "--time-budget to train further)")
            summary = done(folder.checkpoint["state"])
            if rank == 0 and not folder.history_matches(summary["steps"]):   # its last train stopped before it
                folder.write_history(summary)
            return summary
        data, amp = prepared["data"], prepared["amp"]
        for line in data_lines(s, prepared["source"], prepared["splits"], prepared["dropped"]):
            say(line)
        warning = header_warning(prepared["source"])
        if warning:
            say(f"warning: {warning}")
        say(model_line(s, parameters, prepared["vocabulary"]))
        say(f"precision: {amp or 'float32'} (--amp {s.amp})")
        if "attention" in folder.meta:
            say(prepared["attention"][1])
        for change in prepared["changes"]:
            say(f"changed on resume: {change}")
        if rank == 0:
            folder.check_room(model, s.average + 1 if s.average else 0)   # a file it cannot replace, a full disk
        if world_size > 1:
            torch.manual_seed(s.seed + rank)    # the same initial weights, but each rank its own dropout masks
        if s.compile:
            model.compile(dynamic=True)     # in place: parameter names, and so checkpoints, stay the same
        trainer = (DistributedTrainer if context else Trainer)(
            model, prepared["loss_fn"], prepared["optimizer"], lambda epoch: data.batches(epoch, seed=s.seed),
            scheduler=prepared["scheduler"], device=device, max_steps=s.max_steps, time_budget_s=s.time_budget,
            amp_dtype=amp, progress=False, accumulate=s.accumulate, log_every=LOG_EVERY,
            validate=prepared["validate"], validate_every=s.validate_every if prepared["validate"] else None)
        averaging.attach(trainer)           # its snapshot of a step comes before that step's checkpoint
        saved = [None]                      # the step of the checkpoint on disk
        if folder.checkpoint is not None:
            runs.apply_checkpoint(folder.path / runs.CHECKPOINT, folder.checkpoint, trainer.restore)
            averaging.resume(model)
            saved[0] = trainer.state.step
            say(f"resuming {folder.path / runs.CHECKPOINT} at step {trainer.state.step}")

        def save(trainer, final: bool = False) -> None:     # every rank joins; rank 0 writes
            if final and rank == 0:         # --average: the averaged weights or the last, whichever scores higher
                averaging.decide(model, trainer.state.step, prepared["tokenizer"], prepared["splits"].valid,
                                 folder.meta)
            payload = trainer.checkpoint({"run": runs.identity(folder.meta), **averaging.extra()})
            if rank == 0:
                folder.save_checkpoint(payload, done(payload["state"]) if final else None, saved_step=saved[0])
                saved[0] = payload["state"]["step"]

        def every(trainer) -> None:
            if trainer.state.step % s.checkpoint_every == 0 and not trainer._done():
                save(trainer)
        progress = Progress(trainer, s.max_steps, s.time_budget, s.progress and rank == 0, say)
        trainer.add_callback("on_batch_end", every)
        trainer.add_callback("on_batch_end", stop_callback(signals, save, context))
        trainer.add_callback("on_train_end", lambda t: save(t, final=True))
        signals.phase = "training"
        try:
            state = trainer.fit()
        except TrainingStopped as stop:
            stop.run = folder.location()
            raise
        finally:
            signals.phase = "finishing"
            progress.close()
        where = folder.location()
        if signals.received:            # came during the last step or its save, which finished first
            stop = TrainingStopped(signals.received, state.step)
            stop.run = where
            raise stop
        summary = done(vars(state))
        for line in end_lines(summary, where, folder.path if where != folder.path else None, pairs,
                              time.perf_counter() - began):
            say(line)
    return summary


def load_run(run, device=None):
    """The trained model (in eval mode) and tokenizer of a run folder, after checking that its files
    exist, are intact and belong together."""
    folder = RunFolder(run)
    device = resolve_device(device)
    folder.read(device)
    return folder.load_model(device), folder.tokenizer
