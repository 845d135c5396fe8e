"""Choose where tensors live: CUDA, then Apple's MPS, then the CPU.

Hand-written, not exported: every notebook's device cell calls it, so no one notebook is its home.
"""
import torch


def pick_device(prefer: str | None = None) -> torch.device:
    """Return `prefer` if given, else the best accelerator present, else the CPU."""
    if prefer is not None:
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
