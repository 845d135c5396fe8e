"""Where and in which precision a run trains: `resolve_device` (an asked device, checked to be here) and
`resolve_amp` (`--amp auto` by the hardware, measured on a CPU with bf16 instructions).

Hand-written, not exported: a part of `train_run.py`, kept apart to keep each file short; the command
line's `translate` and `evaluate` use `resolve_device` too.
"""
from transformer_lib.run_config import RunError
from transformer_lib.settings import AMP_MEASURE_MIN_STEPS, TrainSettings


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


def launch_amp(s: TrainSettings, device, old_meta: dict | None, model, data, loss_fn) -> str | None:
    """The precision of this launch. "auto" keeps the one the run records (a resumed run trains as it
    began) where it runs on `device`; otherwise it resolves it, measuring on a CPU with bf16
    instructions only for a run long enough to repay the measurement's steps."""
    recorded = (old_meta or {}).get("amp")
    if s.amp == "auto" and recorded is not None and _amp_runs_on(recorded, device):
        return None if recorded == "float32" else recorded
    long_enough = s.max_steps is None or s.max_steps >= AMP_MEASURE_MIN_STEPS
    return resolve_amp(s.amp, device, model, loss_fn=loss_fn, batches=(
        lambda: [batch.to(device) for batch in data.batches(0, seed=s.seed)[:4]]) if long_enough else None)
