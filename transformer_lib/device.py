"""Choose where tensors live (CUDA, then Apple's MPS, then the CPU) and which mixed precision fits the
hardware there: bf16 where the hardware has it, fp16 with a GradScaler on older GPUs, float32 elsewhere.
Also the id checks that a training step defers, so that it never waits for the device.

Hand-written, not exported: every notebook's device cell calls it, and the command line, the Trainer
and the benchmarks share its precision rule, and the loss (notebook 11) and any embedding (notebook 02)
can share the deferred id check, so no one notebook is its home.
"""
import contextlib
import copy
import statistics
import time
from typing import Callable

import torch
from torch import Tensor, nn

# bf16 is chosen on a CPU only when it trains at least this much faster than float32 (5 %).
CPU_BF16_MARGIN = 0.95


def pick_device(prefer: str | None = None) -> torch.device:
    """Return `prefer` if given (ValueError if it is not a device or not present here), else the best
    accelerator present, else the CPU."""
    if prefer is not None:
        return _present_device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _present_device(name) -> torch.device:
    """`name` as a torch.device, refused with a ValueError that says what is here instead when this
    machine has no such device (torch's own error comes later, from deep inside a tensor copy)."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{name!r} is not a device: use cpu, cuda, cuda:N or mps ({error})") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device {name!r}: no CUDA device is visible here (torch {torch.__version__}"
                             f"{', built without CUDA' if torch.version.cuda is None else ''}); use cpu")
        if device.index is not None and device.index >= count:
            raise ValueError(f"device {name!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) is not None
                                     and torch.backends.mps.is_available()):
        raise ValueError(f"device {name!r}: MPS (Apple's GPU) is not available here; use cpu")
    return device


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 instructions (x86 AVX512_BF16 or AMX). Without them bf16 is emulated
    with float32 arithmetic plus conversions, and autocast makes training slower, never faster."""
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):   # torch >= 2.2 has both
        if getattr(torch.cpu, probe, lambda: False)():
            return True
    capability = str(torch.backends.cpu.get_cpu_capability()).upper()     # e.g. "AVX512", "AVX512_BF16"
    return "BF16" in capability or "AMX" in capability


def faster_cpu_autocast(model: nn.Module, batches: list, loss_fn: Callable, rounds: int = 3
                        ) -> tuple[str | None, dict]:
    """"bf16" or None (float32), whichever trains `model` faster on `batches` on this CPU: a copy of the
    model takes `rounds` passes over the batches in each precision, in turn, after one warm-up pass each.
    bf16 must win by 5 % to be chosen. The model and torch's random state are left untouched.

    Args:
        model: on the CPU; copied, never changed.
        batches: a few training batches (e.g. the first 4 of an epoch), on the CPU.
        loss_fn: (model, batch) -> (loss, stats), as for the Trainer.
    Returns:
        (choice, {"float32": median seconds per pass, "bf16": ...})
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if not batches:
        raise ValueError("faster_cpu_autocast needs at least one batch to time")
    seconds = {"float32": [], "bf16": []}
    with torch.random.fork_rng(devices=[]):          # dropout here must not shift the run's random stream
        probe = copy.deepcopy(model).train()
        optimizer = torch.optim.Adam(probe.parameters(), lr=1e-6)
        for round_ in range(rounds + 1):
            for precision in seconds:
                start = time.perf_counter()
                for batch in batches:
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                        loss, _ = loss_fn(probe, batch)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                if round_:                           # the first round warms up
                    seconds[precision].append(time.perf_counter() - start)
    median = {name: round(statistics.median(times), 3) for name, times in seconds.items()}
    return ("bf16" if median["bf16"] < CPU_BF16_MARGIN * median["float32"] else None), median


def pick_amp(device, model: nn.Module | None = None, batches: list | None = None,
             loss_fn: Callable | None = None) -> str | None:
    """The mixed precision that pays on `device`: "bf16", "fp16" (with a GradScaler) or None (float32).

    * CUDA: "bf16" on compute capability >= 8.0 (A100, H100, RTX 30xx and later), which has bf16
      units; "fp16" below (V100, T4: there `torch.cuda.is_bf16_supported()` may say True, but bf16
      runs emulated and slowly).
    * CPU: None without bf16 instructions (`cpu_has_native_bf16`); with them, "bf16" only if
      `faster_cpu_autocast(model, batches, loss_fn)` measures it 5 % faster, so None when no
      model, batches and loss_fn are given to measure with.
    * MPS and anything else: None.
    """
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return "bf16" if (major, minor) >= (8, 0) else "fp16"
    if device.type != "cpu" or not cpu_has_native_bf16():
        return None
    if model is None or not batches or loss_fn is None:
        return None
    return faster_cpu_autocast(model, batches, loss_fn)[0]



# ---------------------------------------------------------------- the CPU's memory allocator
# glibc's malloc serves each block of 32 MiB or more with its own mmap and returns it to the system when it
# is freed. A training step on a CPU allocates several such blocks (the logits and their gradients, B·T × V:
# 2,048 positions × 8,000 tokens in float32 are 66 MB) and frees them again, so every step the kernel maps
# and zeroes those pages anew (docs/results.md, Speed, has what that cost). Raising the threshold
# keeps freed blocks in the heap for the next step instead: no arithmetic changes, only where memory comes from.
_KEEP_FREED_BYTES = 1 << 30      # blocks up to 1 GiB come from the heap and stay there when freed
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # mallopt's parameter numbers, from glibc's malloc.h


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep freed memory (blocks up to 1 GiB) for reuse, instead of mapping large
    blocks afresh for each use and unmapping them when freed. For the whole process, from now on: its
    memory stays near its peak. True where it took effect (Linux with glibc); False elsewhere (macOS,
    Windows, musl, or a glibc that refuses so high a threshold), where nothing changes. `train` calls it for a run on the CPU."""
    import ctypes
    import ctypes.util
    import platform
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_FREED_BYTES)) and \
            bool(libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_FREED_BYTES))   # nor give back a free top under 1 GiB
    except (OSError, AttributeError):
        return False


# ---------------------------------------------------------------- id checks that do not wait for the device
_deferred_checks: list | None = None      # a list while a Trainer step runs (see deferred_id_checks)


@contextlib.contextmanager
def deferred_id_checks():
    """Within it (the Trainer wraps each forward pass in it), `defer_id_check` records its checks on the
    device instead of letting the caller read them on the host, which would wait for a GPU. Yields the
    list of records: (any id wrong, the first wrong id, V, what), the first two as 0-d device tensors."""
    global _deferred_checks
    outer, _deferred_checks = _deferred_checks, []
    try:
        yield _deferred_checks
    finally:
        _deferred_checks = outer


def defer_id_check(ids: Tensor, V: int, what: str, ignore_index: int | None = None) -> Tensor | None:
    """Inside `deferred_id_checks`: record whether some of `ids` lie outside [0, V) (`ignore_index`
    aside) and the first such id, for the Trainer to raise at its next log step, and return the mask
    of those ids, same shape as `ids`, for the caller to keep them out of any indexing. Outside it:
    None, and the caller checks on the host as usual (and raises its ValueError at once).

    Args:
        what: how the error names an id, e.g. "target id" or "token id".
    """
    if _deferred_checks is None:
        return None
    wrong = (ids < 0) | (ids >= V)
    if ignore_index is not None:
        wrong &= ids != ignore_index
    if ids.numel():
        flat = ids.reshape(-1)
        first = flat.gather(0, wrong.reshape(-1).int().argmax().reshape(1)).squeeze(0)   # a wrong id, if any
        _deferred_checks.append((wrong.any(), first, V, what))
    return wrong
