"""Tests for transformer_lib.positional (notebook 03): sinusoidal_table and PositionalEncoding."""
import math

import pytest
import torch

from transformer_lib.positional import PositionalEncoding, sinusoidal_table

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def naive_table(max_len: int, d_model: int) -> torch.Tensor:
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i] = math.sin(angle)
            table[pos, 2 * i + 1] = math.cos(angle)
    return table


def shift_matrix(k: int, d_model: int) -> torch.Tensor:
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    cos, sin = (k * omega).cos(), (k * omega).sin()
    blocks = [torch.tensor([[c, s], [-s, c]], dtype=torch.float64) for c, s in zip(cos.tolist(), sin.tolist())]
    return torch.block_diag(*blocks)                                   # (D, D)


@pytest.mark.parametrize("max_len, d_model", [(1, 2), (7, 8), (50, 16), (300, 64)])
def test_table_matches_double_loop(max_len, d_model):
    table = sinusoidal_table(max_len, d_model)
    assert table.shape == (max_len, d_model) and table.dtype == torch.float32
    torch.testing.assert_close(table, naive_table(max_len, d_model).float(), rtol=0, atol=1e-6)


def test_known_values():
    table = sinusoidal_table(10, 8)
    assert torch.equal(table[0], torch.tensor([0.0, 1.0] * 4))
    # d_model=8, pair i=1: w_1 = 10000 ** (-2/8) = 1/10
    torch.testing.assert_close(table[3, 2], torch.tensor(math.sin(0.3)))
    torch.testing.assert_close(table[3, 3], torch.tensor(math.cos(0.3)))
    torch.testing.assert_close(table[:, 0], torch.sin(torch.arange(10.0)))


def test_late_positions_accurate():
    # computed in float64, so even position 4999 with w_0 = 1 is exact to float32 rounding
    torch.testing.assert_close(sinusoidal_table(5000, 512)[4999, :2],
                               torch.tensor([math.sin(4999), math.cos(4999)]), rtol=0, atol=1e-6)


def test_bigger_table_starts_with_smaller_one():
    torch.testing.assert_close(sinusoidal_table(3000, 64)[:1000], sinusoidal_table(1000, 64), rtol=0, atol=1e-7)


@pytest.mark.parametrize("k", [1, 3, 17, 256, 1023])
def test_shift_is_fixed_rotation_for_every_position(k):
    max_len, d_model = 1024, 64
    table = sinusoidal_table(max_len, d_model).double()
    predicted = table[:max_len - k] @ shift_matrix(k, d_model).T      # rows: (M_k PE(pos))^T
    torch.testing.assert_close(predicted, table[k:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_zero_adds_table_exactly(device):
    torch.manual_seed(0)
    module = PositionalEncoding(16, max_len=40, dropout=0.0).to(device)
    x = torch.randn(3, 11, 16, device=device)
    expected = x + sinusoidal_table(40, 16)[:11].to(device)
    assert torch.equal(module(x), expected)


@pytest.mark.parametrize("offset", [0, 1, 5, 29])
def test_offset_uses_shifted_rows(offset):
    torch.manual_seed(0)
    module = PositionalEncoding(16, max_len=40, dropout=0.0)
    x = torch.randn(2, 11, 16)
    torch.testing.assert_close(module(x, offset=offset), x + sinusoidal_table(40, 16)[offset:offset + 11])


def test_one_position_at_a_time_equals_whole_sequence():
    torch.manual_seed(0)
    module = PositionalEncoding(16, max_len=20, dropout=0.3).eval()
    x = torch.randn(2, 20, 16)
    steps = torch.cat([module(x[:, t:t + 1], offset=t) for t in range(20)], dim=1)
    assert torch.equal(steps, module(x))


def test_eval_mode_deterministic_and_train_mode_drops():
    torch.manual_seed(0)
    module = PositionalEncoding(32, max_len=64, dropout=0.5)
    x = torch.randn(4, 64, 32)
    clean = x + sinusoidal_table(64, 32)
    module.eval()
    assert torch.equal(module(x), module(x)) and torch.equal(module(x), clean)
    module.train()
    out = module(x)
    dropped = out == 0
    assert 0.4 < dropped.float().mean().item() < 0.6
    torch.testing.assert_close(out[~dropped], 2 * clean[~dropped])    # survivors scaled by 1/(1-p)


def test_table_is_non_persistent_buffer():
    module = PositionalEncoding(16, max_len=10)
    assert "pe" in dict(module.named_buffers())
    assert "pe" not in module.state_dict()
    PositionalEncoding(16, max_len=500).load_state_dict(module.state_dict())  # strict load, other max_len


def test_half_precision_input_keeps_dtype():
    module = PositionalEncoding(16, max_len=10, dropout=0.0)
    x = torch.zeros(1, 4, 16, dtype=torch.bfloat16)
    out = module(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, sinusoidal_table(10, 16)[:4].to(torch.bfloat16).unsqueeze(0))


@pytest.mark.parametrize("length, offset", [(11, 0), (1, 10), (6, 5)])
def test_too_long_raises(length, offset):
    module = PositionalEncoding(16, max_len=10)
    with pytest.raises(ValueError, match=r"max_len=10.*larger max_len") as info:
        module(torch.zeros(1, length, 16), offset=offset)
    assert f"max_len={offset + length}" in str(info.value)


@pytest.mark.parametrize("shape", [(1, 5, 8), (5, 16), (1, 2, 5, 16)])
def test_wrong_shape_raises(shape):
    with pytest.raises(ValueError, match=r"\(B, L, 16\)"):
        PositionalEncoding(16, max_len=10)(torch.zeros(shape))


def test_bad_offset_raises():
    module = PositionalEncoding(16, max_len=10)
    with pytest.raises(ValueError, match="offset must be >= 0"):
        module(torch.zeros(1, 2, 16), offset=-1)
    with pytest.raises(TypeError, match="offset must be an int"):
        module(torch.zeros(1, 2, 16), offset=1.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=15), "d_model must be even"), (dict(d_model=0), "d_model"), (dict(d_model=16.0), "d_model"),
    (dict(d_model=16, max_len=0), "max_len"), (dict(d_model=16, max_len=10.5), "max_len"),
    (dict(d_model=16, dropout=1.0), "dropout"), (dict(d_model=16, dropout=-0.1), "dropout"),
    (dict(d_model=16, dropout="0.1"), "dropout"),
])
def test_bad_constructor_args_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PositionalEncoding(**kwargs)


@pytest.mark.parametrize("max_len, d_model, match", [(0, 8, "max_len"), (4, 7, "even"), (4, -2, "d_model")])
def test_bad_table_args_raise(max_len, d_model, match):
    with pytest.raises(ValueError, match=match):
        sinusoidal_table(max_len, d_model)
