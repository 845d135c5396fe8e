"""Mixed precision by capability (transformer_lib.device): bf16 on CUDA >= 8.0, fp16 below (never bf16 by
emulation on a T4), on the CPU bf16 only with bf16 instructions and only where it measured 5 % faster,
float32 on MPS. Every branch runs here with a mocked device capability."""
import pytest
import torch
from torch import nn

from transformer_lib import device as device_module
from transformer_lib.device import cpu_has_native_bf16, faster_cpu_autocast, pick_amp


def native_cpu(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: native)


def no_measuring(*args, **kwargs):
    raise AssertionError("faster_cpu_autocast must not run here")


@pytest.mark.parametrize("capability, expected", [
    ((6, 1), "fp16"), ((7, 0), "fp16"), ((7, 5), "fp16"),        # P100, V100, T4 (Colab's free GPU)
    ((8, 0), "bf16"), ((8, 6), "bf16"), ((8, 9), "bf16"), ((9, 0), "bf16"), ((10, 0), "bf16")])
def test_cuda_choice_follows_the_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)   # what a T4 answers
    monkeypatch.setattr(device_module, "faster_cpu_autocast", no_measuring)
    assert pick_amp("cuda") == expected
    assert pick_amp(torch.device("cuda", 0)) == expected


def test_mps_and_other_devices_stay_in_float32(monkeypatch):
    monkeypatch.setattr(device_module, "faster_cpu_autocast", no_measuring)
    native_cpu(monkeypatch, True)
    assert pick_amp("mps") is None
    assert pick_amp("meta") is None


def test_cpu_without_bf16_instructions_is_float32_without_measuring(monkeypatch):
    native_cpu(monkeypatch, False)
    monkeypatch.setattr(device_module, "faster_cpu_autocast", no_measuring)
    assert pick_amp("cpu", nn.Linear(2, 2), [object()], lambda m, b: None) is None


@pytest.mark.parametrize("measured", ["bf16", None])
def test_cpu_with_bf16_instructions_takes_what_measured_faster(monkeypatch, measured):
    native_cpu(monkeypatch, True)
    calls = []

    def fake_measure(model, batches, loss_fn):
        calls.append(len(batches))
        return measured, {"float32": 1.0, "bf16": 0.5 if measured else 1.0}
    monkeypatch.setattr(device_module, "faster_cpu_autocast", fake_measure)
    assert pick_amp("cpu", nn.Linear(2, 2), [1, 2, 3], lambda m, b: None) == measured
    assert calls == [3]
    assert pick_amp("cpu") is None                   # nothing to measure with: float32
    assert calls == [3]


@pytest.mark.parametrize("probes, capability, expected", [
    ({"_is_avx512_bf16_supported": True, "_is_amx_tile_supported": False}, "AVX512", True),
    ({"_is_avx512_bf16_supported": False, "_is_amx_tile_supported": True}, "AVX512", True),
    ({"_is_avx512_bf16_supported": False, "_is_amx_tile_supported": False}, "AVX2", False),
    ({"_is_avx512_bf16_supported": False, "_is_amx_tile_supported": False}, "AVX512_BF16", True),
    ({}, "DEFAULT", False),                          # a torch without the probes
])
def test_native_bf16_detection(monkeypatch, probes, capability, expected):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        if name in probes:
            monkeypatch.setattr(torch.cpu, name, lambda value=probes[name]: value, raising=False)
        else:
            monkeypatch.delattr(torch.cpu, name, raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert cpu_has_native_bf16() is expected


class FakeClock:
    """perf_counter that advances only when the loss function says so: 1 s per float32 batch and
    `bf16_cost` s per bf16 batch, so the 5 % rule is tested without timing anything real."""

    def __init__(self, bf16_cost: float):
        self.now, self.bf16_cost = 0.0, bf16_cost

    def loss_fn(self, model, batch):
        self.now += self.bf16_cost if torch.is_autocast_enabled("cpu") else 1.0
        return model(batch).square().mean(), {}


@pytest.mark.parametrize("bf16_cost, expected", [(0.5, "bf16"), (0.94, "bf16"), (0.96, None), (1.3, None)])
def test_faster_cpu_autocast_needs_a_5_percent_win(monkeypatch, bf16_cost, expected):
    clock = FakeClock(bf16_cost)
    monkeypatch.setattr(device_module.time, "perf_counter", lambda: clock.now)
    choice, seconds = faster_cpu_autocast(nn.Linear(3, 3), [torch.randn(4, 3)] * 2, clock.loss_fn)
    assert choice == expected
    assert seconds == {"float32": 2.0, "bf16": round(2 * bf16_cost, 3)}


def test_faster_cpu_autocast_leaves_the_model_and_the_random_stream_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 1))
    before = {name: t.clone() for name, t in model.state_dict().items()}
    batch = torch.randn(16, 8)
    rng = torch.get_rng_state()
    choice, seconds = faster_cpu_autocast(model, [batch], lambda m, x: (m(x).mean(), {}), rounds=1)
    assert choice in ("bf16", None) and set(seconds) == {"float32", "bf16"}
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, before[name], rtol=0, atol=0)
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("rounds, batches, message", [(0, [1], "rounds must be a positive int"),
                                                      (2, [], "at least one batch")])
def test_faster_cpu_autocast_bad_arguments(rounds, batches, message):
    with pytest.raises(ValueError, match=message):
        faster_cpu_autocast(nn.Linear(1, 1), batches, lambda m, b: None, rounds=rounds)
