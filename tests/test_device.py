"""pick_device: a device asked for by name is refused with one ValueError that says what this machine
has, where torch would fail later, deep inside the first tensor copied there. keep_freed_memory: large
blocks are reused, not mapped afresh (counted in page faults)."""
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
PAGE_FAULTS = """
import resource, sys, torch
from transformer_lib.device import keep_freed_memory
if sys.argv[1] == "keep" and not keep_freed_memory():
    sys.exit("keep_freed_memory() said False")
for _ in range(4):                                             # warm up: the heap grows to hold it
    block = torch.ones(16_000_000); del block                  # 64 MB, as a step's float32 logits
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    block = torch.ones(16_000_000); del block
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_keep_freed_memory_stops_mapping_large_blocks_afresh():
    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", PAGE_FAULTS, mode], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)
    default, kept = faults("default"), faults("keep")
    assert default > 5 * 10_000            # each 64 MB block mapped and faulted in again (4 KiB pages)
    assert kept < default / 10             # the freed block is reused


def test_keep_freed_memory_changes_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    assert keep_freed_memory() is False
