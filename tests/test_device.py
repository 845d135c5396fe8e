"""pick_device: a device asked for by name is refused with one ValueError that says what this machine
has, where torch would fail later, deep inside the first tensor copied there. keep_freed_memory: large
blocks are reused, not mapped afresh (malloc's count of separately mapped bytes)."""
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lib import device as device_module
from transformer_lib.device import keep_freed_memory, pick_device

ROOT = Path(__file__).resolve().parent.parent


def test_cpu_and_the_default():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device().type in {"cpu", "cuda", "mps"}


@pytest.mark.parametrize("name, message", [("gpu", "'gpu' is not a device: use cpu, cuda, cuda:N or mps"),
                                           ("cuda:x", "is not a device")])
def test_not_a_device(name, message):
    with pytest.raises(ValueError, match=message):
        pick_device(name)


def test_absent_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device 'cuda': no CUDA device is visible here .*use cpu"):
        pick_device("cuda")


def test_cuda_index_beyond_the_devices_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        pick_device("cuda:2")


def test_absent_mps(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="MPS .* is not available here"):
        pick_device("mps")
    assert device_module.pick_device("cpu").type == "cpu"


GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
MAPPED_BYTES = """
import ctypes, sys, torch
from transformer_lib.device import keep_freed_memory

class MallInfo2(ctypes.Structure):      # glibc >= 2.33: malloc's own counters
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep" and not keep_freed_memory():
    sys.exit("keep_freed_memory() said False")
block = torch.ones(16_000_000)           # 64 MB, about a step's float32 logits
print(mallinfo2().hblkhd)                # bytes in blocks that malloc mapped on their own (and unmaps on free)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_keep_freed_memory_serves_large_blocks_from_the_heap():
    def mapped_bytes(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", MAPPED_BYTES, mode], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)
    assert mapped_bytes("default") >= 64_000_000   # mapped on its own: unmapped when freed, faulted in anew
    assert mapped_bytes("keep") < 64_000_000       # from the heap, where a freed block waits for the next step


def test_keep_freed_memory_changes_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    assert keep_freed_memory() is False
