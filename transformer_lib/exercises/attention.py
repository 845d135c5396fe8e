"""Checkers for the exercises of notebook 04 (scaled dot-product attention).

Hand-written, not exported (see `transformer_lib.exercises`): each `check_…(your_function)` runs the
learner's function on small fixed inputs, compares it with the course's `scaled_dot_product_attention`,
and for a wrong answer names the likely slip (no scale, a fully masked row, the mask's meaning, ...).
"""
import math

import torch
from torch import Tensor

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.exercises import run_checker


def _close(result, expected: Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    return (isinstance(result, Tensor) and result.shape == expected.shape
            and bool(torch.allclose(result.to(expected.dtype), expected, atol=atol, rtol=rtol)))


def _check_tensor(name: str, result, expected: Tensor) -> None:
    assert isinstance(result, Tensor), f"{name} must return a torch.Tensor, got {type(result).__name__}"
    assert result.shape == expected.shape, \
        f"{name} returned shape {tuple(result.shape)}, expected {tuple(expected.shape)}"


def _reference_masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    weights = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)  # NaN in fully masked rows
    return weights.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)


def _masked_softmax_inputs() -> list[tuple[Tensor, Tensor]]:
    generator = torch.Generator().manual_seed(4)
    scores = 3 * torch.randn(2, 3, 5, generator=generator)              # (B, Lq, Lk)
    mask = torch.rand(2, 3, 5, generator=generator) < 0.4              # (B, Lq, Lk): True = blocked
    mask[0, 1] = True                                                  # a row with every key blocked
    mask[1, 2] = False                                                 # a row with none blocked
    causal = torch.triu(torch.ones(3, 5, dtype=torch.bool), diagonal=1)  # (Lq, Lk), broadcast over B
    return [(scores, mask), (scores, causal)]


def _check_masked_softmax(masked_softmax) -> None:
    for scores, mask in _masked_softmax_inputs():
        result = masked_softmax(scores.clone(), mask.clone())
        expected = _reference_masked_softmax(scores, mask)
        _check_tensor("masked_softmax", result, expected)
        if _close(result, _reference_masked_softmax(scores, ~mask)):
            raise AssertionError("you kept the entries where mask is True and blocked the others; in the course "
                                 "(and nn.MultiheadAttention) True means 'may NOT attend'")
        full_rows = mask.expand_as(scores).all(dim=-1)                  # (B, Lq)
        if full_rows.any():
            assert not result[full_rows].isnan().any(), (
                "a row whose entries are all masked gave NaN (softmax of a row of -inf is 0/0). Find those "
                "rows with mask.all(dim=-1, keepdim=True) and return zeros there")
            uniform = torch.full_like(result[full_rows], 1 / scores.size(-1))
            assert not torch.allclose(result[full_rows], uniform), (
                "a row whose entries are all masked gave uniform weights 1/Lk instead of zeros: with a large "
                "negative fill such as -1e9 every entry of that row is equal. Zero those rows explicitly")
            assert (result[full_rows] == 0).all(), "a row whose entries are all masked must get all-zero weights"
        blocked = mask.expand_as(scores)
        assert (result[blocked] == 0).all(), "entries where mask is True must get weight exactly 0 (fill with -inf)"
        if _close(result, _reference_masked_softmax(scores.transpose(-2, -1), mask.expand_as(scores).transpose(-2, -1)).transpose(-2, -1)):
            raise AssertionError("the softmax ran over the wrong dimension: it must normalise the last one (dim=-1)")
        torch.testing.assert_close(result.to(expected.dtype), expected, atol=1e-6, rtol=1e-5, msg=lambda m: (
            "masked_softmax differs from softmax(scores.masked_fill(mask, -inf), dim=-1) on the rows that are not "
            f"fully masked: {m}"))


def check_masked_softmax(your_function) -> bool:
    """Exercise 1 of notebook 04: `masked_softmax(scores, mask)`, zeros (not NaN) for fully masked rows."""
    return run_checker("masked softmax", your_function, _check_masked_softmax)


def _attention(query: Tensor, key: Tensor, value: Tensor, scale: float, dim: int = -1) -> Tensor:
    return (query @ key.T / scale).softmax(dim=dim) @ value


def _check_attention_by_loops(attention_by_loops) -> None:
    generator = torch.Generator().manual_seed(4)
    query = 2 * torch.randn(3, 4, generator=generator)                 # (Lq, d_k)
    key = 2 * torch.randn(5, 4, generator=generator)                   # (Lk, d_k)
    value = torch.randn(5, 2, generator=generator)                     # (Lk, d_v)
    expected, _ = scaled_dot_product_attention(query, key, value)      # (Lq, d_v)
    result = attention_by_loops(query.clone(), key.clone(), value.clone())
    if isinstance(result, (list, tuple)) and not isinstance(result, Tensor):
        try:
            result = torch.tensor(result, dtype=expected.dtype)
        except (TypeError, ValueError):
            raise AssertionError("attention_by_loops must return a (Lq, d_v) tensor (or a nested list of numbers)")
    _check_tensor("attention_by_loops", result, expected)
    d_k = query.size(-1)
    slips = {"the scores were not scaled: divide each q·k by sqrt(d_k)": _attention(query, key, value, 1.0),
             "the scores were divided by d_k; the paper divides by sqrt(d_k)": _attention(query, key, value, d_k),
             "the scores were multiplied by sqrt(d_k) instead of divided by it": _attention(query, key, value, 1 / math.sqrt(d_k)),
             "the softmax ran over the queries; for each query, normalise over the keys":
                 _attention(query, key, value, math.sqrt(d_k), dim=0)}
    for message, wrong in slips.items():
        assert not _close(result, wrong), message
    torch.testing.assert_close(result.to(expected.dtype), expected, atol=1e-5, rtol=1e-4, msg=lambda m: (
        "attention_by_loops differs from softmax(Q Kᵀ / sqrt(d_k)) V; check that output i is the sum over keys j "
        f"of weight[i, j] * value[j]: {m}"))


def check_attention_by_loops(your_function) -> bool:
    """Exercise 2 of notebook 04: eq. 1 with Python loops, one query at a time."""
    return run_checker("attention by loops", your_function, _check_attention_by_loops)
