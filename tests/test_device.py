"""pick_device: a device asked for by name is refused with one ValueError that says what this machine
has, where torch would fail later, deep inside the first tensor copied there."""
import pytest
import torch

from transformer_lib import device as device_module
from transformer_lib.device import pick_device


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
