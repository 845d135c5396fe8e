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
import uuid
import signal
import sys
import threading
from pathlib import Path

from transformer_lib import runs
from transformer_lib.run_config import check_data_dir
from transformer_lib.runs import RunError, RunFolder, one_line
from transformer_lib.settings import AMP_MEASURE_MIN_STEPS, LOG_EVERY, TrainSettings


def resolve_device(name=None):
    """The torch.device for `name` (None: the best present); RunError if that device is not here."""
    import torch
    from transformer_lib.device import pick_device
    if name is None:
        return pick_device()
    try:
        device = torch.device(str(name))
    except RuntimeError:
        raise RunError(f"--device {name}: unknown device; use cpu, cuda, cuda:N or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise RunError(f"--device {name}: unknown device; use cpu, cuda, cuda:N or mps")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RunError(f"--device {name}: this torch sees no CUDA GPU; use --device cpu (or leave --device out)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise RunError(f"--device {name}: there are only {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise RunError(f"--device {name}: Apple's MPS is not available here; use --device cpu")
    return device


def resolve_amp(choice: str, device, model=None, batches=None, loss_fn=None) -> str | None:
    """`amp` as the Trainer takes it: "bf16", "fp16" or None (float32). "auto" asks `pick_amp`: on
    CUDA by capability; on a CPU with bf16 instructions, bf16 only if it trains faster on `batches()`
    (a callable, so that they are built only to be measured; None: not measured, float32); else float32."""
    import torch
    if choice != "auto":
        return None if choice == "none" else choice
    from transformer_lib.device import cpu_has_native_bf16, pick_amp
    device = torch.device(device)
    measure = device.type == "cpu" and batches is not None and cpu_has_native_bf16()
    return pick_amp(device, model, batches() if measure else None, loss_fn)


def _amp_runs_on(amp: str, device) -> bool:
    return amp == "float32" or device.type == "cuda" or (amp == "bf16" and device.type == "cpu")


def check_settings(settings: TrainSettings, device) -> None:
    """RunError for settings that contradict each other or this machine (before any work)."""
    s = settings
    if s.amp == "fp16" and device.type != "cuda" or s.amp == "bf16" and device.type not in ("cuda", "cpu"):
        raise RunError(f"--amp {s.amp} does not run on {device.type}; fp16 needs CUDA, bf16 CUDA or the CPU")
    if s.max_steps is None and s.time_budget is None:
        raise RunError("give --max-steps or --time-budget (or both), or training never stops")
    check_data_dir(s.source.kind, s.data_dir)      # TrainSettings checked the rest of the data options


# --- signals ----------------------------------------------------------------------------------------

class _Signals:
    """SIGINT (Ctrl-C) and SIGTERM during `train_run`: while training (and saving), the step under way
    finishes and `received` is set, for the callback that then saves a checkpoint; at any other
    `phase` ("preparing", "finishing"), or a second time, they stop at once. Main thread only."""

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
        raise TrainingStopped(signum, phase=self.phase)


class TrainingStopped(KeyboardInterrupt):
    """A signal stopped training in `phase`; `step` is set when a checkpoint was saved at that step."""

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
                           source=source.to_dict(), split_prints={k: v for k, v in prints.items() if k != "train"})


def _source_of(s: TrainSettings, old_meta: dict | None):
    """The data source this launch reads: the settings' one; for a run begun before runs recorded their
    source, opus_books as it was read then (all of it for training, nothing carved)."""
    if old_meta is not None and "source" not in old_meta and s.source.kind == "opus_books":
        import dataclasses
        return dataclasses.replace(s.source, valid_fraction=0, test_fraction=0)
    return s.source


def _data_option(s: TrainSettings, split: str) -> str:
    """The options that chose the pairs of `split`, for messages."""
    where = f"--data {s.data}" + (f" --data-dir {s.data_dir}" if s.data_dir else "")
    if split == "train" or s.source.kind in ("builtin", "multi30k"):
        return where
    given = getattr(s.source, split)
    return f"--{split} {s.valid if split == 'valid' else s.test}" if given is not None else (
        f"{where} carved by --{split}-fraction {getattr(s.source, split + '_fraction')} --split-seed {s.split_seed}")


def _prepare(folder: RunFolder, s: TrainSettings, device, processes: int, write: bool) -> dict:
    """Check the run folder, data and settings; build the model, data and optimizer; with `write`,
    then write tokenizer.json and config.json. A finished run returns at once ({"finished": why})."""
    from transformer_lib.data import TranslationData
    from transformer_lib.model import build_transformer
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
        model = build_transformer(config).to(device)
        if folder.checkpoint is not None:   # fitted now, so a bad file is refused before anything runs
            runs.apply_checkpoint(folder.path / runs.CHECKPOINT, folder.checkpoint,
                                  lambda c: load_weights(model, c["model"]))
            finished = runs.finished_reason(folder.checkpoint["state"], s.max_steps, s.time_budget)
            if finished:
                return {"finished": finished, "model": model}
    else:
        runs.check_new_run_folder(folder.path)
    source = _source_of(s, old_meta)
    try:
        splits = read_source(source)    # a malformed file: ValueError naming it, its line and the fix
    except ValueError as error:
        if "too few to carve" not in str(error):
            raise
        raise RunError(f"{one_line(error)} (--valid-fraction, --test-fraction; --valid, --test)") from None
    train_pairs, prints = splits.train, splits.fingerprint()
    if old_meta is not None:
        for split in ("train", "valid", "test"):
            runs.check_same_data(folder.path, old_meta, prints[split], _data_option(s, split), split)
    else:
        tokenizer = train_bpe_tokenizer([text for pair in train_pairs for text in pair], vocab_size=s.vocab_size)
        tokenizer.fingerprint = runs.fingerprint_tokenizer(tokenizer.tokenizer.to_str())
        config = _model_config(s, tokenizer.vocab_size, tokenizer.pad_id)
        model = build_transformer(config).to(device)
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
        valid_batches = TranslationData(splits.valid, tokenizer, s.max_tokens, max_len=config.max_len,
                                        pad_to_multiple=s.batch_multiple).batches(0, shuffle=False)
        validate = lambda m: validation_loss(m, valid_batches, loss_fn)   # noqa: E731
    amp = _amp(s, device, old_meta, model, data, loss_fn)
    meta = {**_meta(s, source, config, processes, tokenizer.fingerprint, prints),
            "run_id": (old_meta or {}).get("run_id") or uuid.uuid4().hex}
    if old_meta is not None:        # what an older run did not record is recorded now; what changed, with its step
        step = folder.checkpoint["state"]["step"] if folder.checkpoint else 0
        meta = {**meta, "format": old_meta.get("format", 1),
                "fingerprints": old_meta.get("fingerprints", meta["fingerprints"]),
                "source": old_meta.get("source", meta["source"]),      # the same pairs, perhaps from moved files
                "changes": old_meta.get("changes", []) + [{"step": step, "change": c} for c in changes]}
    meta["amp"] = (old_meta or {}).get("amp") or amp or "float32"
    if write and meta != old_meta:       # everything checked: only now is the folder written
        folder.start(meta, tokenizer if old_meta is None else None)
    folder.meta = meta
    return {"model": model, "data": data, "optimizer": optimizer, "scheduler": scheduler, "loss_fn": loss_fn,
            "validate": validate, "amp": amp, "changes": changes}


def _amp(s: TrainSettings, device, old_meta: dict | None, model, data, loss_fn) -> str | None:
    """The precision of this launch. "auto" keeps the one the run records (a resumed run trains as it
    began) where it runs on `device`; otherwise it resolves it, measuring on a CPU with bf16
    instructions only for a run long enough to repay the measurement's steps."""
    recorded = (old_meta or {}).get("amp")
    if s.amp == "auto" and recorded is not None and _amp_runs_on(recorded, device):
        return None if recorded == "float32" else recorded
    long_enough = s.max_steps is None or s.max_steps >= AMP_MEASURE_MIN_STEPS
    return resolve_amp(s.amp, device, model, loss_fn=loss_fn, batches=(
        lambda: [batch.to(device) for batch in data.batches(0, seed=s.seed)[:4]]) if long_enough else None)


def _prepare_in_turn(folder: RunFolder, s: TrainSettings, device, context, resources) -> dict:
    """On rank 0 (or alone): lock the folder (held in `resources`) and `_prepare`; then on the other
    ranks, which wait for rank 0's verdict: when it refuses, every rank stops (rank 0 says why)."""
    import torch.distributed as dist

    def first() -> dict:
        runs.check_writable(folder.path, "--run", folder=True)
        resources.enter_context(folder.lock())
        return _prepare(folder, s, device, context.world_size if context else 1, write=True)
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
    precision it trained in). Everything is checked before the folder is written, so a refused call
    leaves it as it was. `announce` prints the precision, the step it resumes at, what changed on
    resume, or that the run is finished (course_model keeps the notebooks' output free of them)."""
    import torch
    from transformer_lib.distributed import DistributedTrainer, launched_by_torchrun, setup_distributed
    from transformer_lib.training import Trainer
    if not isinstance(settings, TrainSettings):
        raise TypeError(f"settings must be a TrainSettings, got {type(settings).__name__}; build one with "
                        "TrainSettings(d_model=..., max_steps=...)")
    s, folder = settings, RunFolder(run)
    runs.check_path_text(folder.path, "--run")
    device = resolve_device(s.device)
    check_settings(s, device)
    if s.threads:
        torch.set_num_threads(s.threads)
    context = setup_distributed(device) if launched_by_torchrun() else None
    device, rank, world_size = (context.device, context.rank, context.world_size) if context else (device, 0, 1)
    say = (lambda text: print(text, file=sys.stderr)) if rank == 0 and announce else (lambda text: None)
    with contextlib.ExitStack() as resources:
        signals = resources.enter_context(_Signals())
        torch.manual_seed(s.seed)
        prepared = _prepare_in_turn(folder, s, device, context, resources)
        parameters = sum(p.numel() for p in prepared["model"].parameters())
        launch_amp = folder.meta.get("amp", "float32") if "finished" in prepared else prepared["amp"] or "float32"
        done = lambda state: {**runs.summary(state, parameters, world_size, s.accumulate),   # noqa: E731
                              "amp": launch_amp}        # the precision this launch trained in
        if "finished" in prepared:
            say(f"{folder.path} is finished: {prepared['finished']}; nothing was changed (raise --max-steps or "
                "--time-budget to train further)")
            summary = done(folder.checkpoint["state"])
            if rank == 0 and not (folder.path / runs.HISTORY).is_file():    # its last train was stopped before it
                runs.write_json(folder.path / runs.HISTORY, summary)
            return summary
        model, data, amp = prepared["model"], prepared["data"], prepared["amp"]
        say(f"precision: {amp or 'float32'} (--amp {s.amp})")
        for change in prepared["changes"]:
            say(f"changed on resume: {change}")
        if world_size > 1:
            torch.manual_seed(s.seed + rank)    # the same initial weights, but each rank its own dropout masks
        if s.compile:
            model.compile(dynamic=True)     # in place: parameter names, and so checkpoints, stay the same
        trainer = (DistributedTrainer if context else Trainer)(
            model, prepared["loss_fn"], prepared["optimizer"], lambda epoch: data.batches(epoch, seed=s.seed),
            scheduler=prepared["scheduler"], device=device, max_steps=s.max_steps, time_budget_s=s.time_budget,
            amp_dtype=amp, progress=s.progress, accumulate=s.accumulate, log_every=LOG_EVERY,
            validate=prepared["validate"], validate_every=s.validate_every if prepared["validate"] else None)
        if folder.checkpoint is not None:
            runs.apply_checkpoint(folder.path / runs.CHECKPOINT, folder.checkpoint, trainer.restore)
            say(f"resuming {folder.path / runs.CHECKPOINT} at step {trainer.state.step}")

        def save(trainer, final: bool = False) -> None:     # every rank joins; rank 0 writes
            payload = trainer.checkpoint({"run": runs.identity(folder.meta)})
            if rank == 0:
                folder.save_checkpoint(payload, done(payload["state"]) if final else None)

        def every(trainer) -> None:
            if trainer.state.step % s.checkpoint_every == 0 and not trainer._done():
                save(trainer)
        trainer.add_callback("on_batch_end", every)
        trainer.add_callback("on_batch_end", _stop_callback(signals, save, context))
        trainer.add_callback("on_train_end", lambda t: save(t, final=True))
        signals.phase = "training"
        try:
            state = trainer.fit()
        finally:
            signals.phase = "finishing"
        if signals.received:            # came during the last step or its save, which finished first
            raise TrainingStopped(signals.received, state.step)
    return done(vars(state))


def _stop_callback(signals: _Signals, save, context):
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
            save(trainer, final=trainer._done())
            raise TrainingStopped(received, trainer.state.step)
    return stop


def load_run(run, device=None):
    """The trained model (in eval mode) and tokenizer of a run folder, after checking that its files
    exist, are intact and belong together."""
    folder = RunFolder(run)
    device = resolve_device(device)
    folder.read(device)
    return folder.load_model(device), folder.tokenizer
