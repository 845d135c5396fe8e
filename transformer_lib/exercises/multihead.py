"""Checkers for the exercises of notebook 05 (multi-head attention).

Hand-written, not exported (see `transformer_lib.exercises`): each `check_…(your_function)` compares
the learner's function with the course's `split_heads` or `MultiHeadAttention` on small fixed inputs,
and for a wrong answer names the likely slip (a view without transpose, no causal mask, ...).
"""
import math

import torch
from torch import Tensor

from transformer_lib.attention import subsequent_mask
from transformer_lib.exercises import run_checker
from transformer_lib.multihead import MultiHeadAttention, merge_heads, split_heads


def _check_split_heads(my_split_heads) -> None:
    for B, L, D, H in [(2, 3, 8, 4), (1, 5, 6, 2)]:
        x = torch.arange(B * L * D, dtype=torch.float32).view(B, L, D)  # (B, L, D): every entry different
        expected = split_heads(x, H)                                     # (B, H, L, d_k)
        result = my_split_heads(x.clone(), H)
        assert isinstance(result, Tensor), f"my_split_heads must return a torch.Tensor, got {type(result).__name__}"
        if tuple(result.shape) == (B, L, H, D // H):
            raise AssertionError(f"shape {tuple(result.shape)} is (B, L, H, d_k): move the heads before the "
                                 f"positions with .transpose(1, 2) to get (B, H, L, d_k)")
        assert result.shape == expected.shape, \
            f"expected shape (B, H, L, d_k) = {tuple(expected.shape)} for n_heads={H}, got {tuple(result.shape)}"
        if torch.equal(result, x.reshape(B, H, L, D // H)):
            raise AssertionError("x.view(B, H, L, d_k) has the right shape but mixes positions and features: "
                                 "head 0 would get whole positions. View as (B, L, H, d_k), then transpose(1, 2)")
        assert torch.equal(result, expected), (
            f"head i must hold features i*d_k .. (i+1)*d_k - 1 of every position; for x = arange, head 1 of "
            f"position 0 is {expected[0, 1, 0].tolist()}, yours is {result[0, 1, 0].tolist()}")
        assert torch.equal(merge_heads(result), x), "merge_heads(my_split_heads(x)) must give x back"


def check_split_heads(your_function) -> bool:
    """Exercise 1 of notebook 05: (B, L, D) -> (B, H, L, d_k)."""
    return run_checker("split heads", your_function, _check_split_heads)


def _by_hand(layer: MultiHeadAttention, x: Tensor, mask: Tensor | None, scale: float, out_proj: bool = True) -> Tensor:
    q, k, v = (split_heads(proj(x), layer.n_heads) for proj in (layer.q_proj, layer.k_proj, layer.v_proj))
    scores = q @ k.transpose(-2, -1) / scale                             # (B, H, T, T)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    out = merge_heads(scores.softmax(dim=-1) @ v)                        # (B, T, D)
    return layer.out_proj(out) if out_proj else out


def _refuse_the_layer(module, args):
    raise AssertionError("causal_self_attention called the layer itself; use its projections "
                         "layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj instead")


def _check_causal_self_attention(causal_self_attention) -> None:
    generator = torch.Generator().manual_seed(5)
    B, T, D, H = 2, 5, 16, 4
    layer = MultiHeadAttention(D, H).eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    x = torch.randn(B, T, D, generator=generator)                        # (B, T, D)
    causal = subsequent_mask(T)                                          # (T, T): True above the diagonal
    with torch.no_grad():
        expected, _ = layer(x, x, x, attn_mask=causal)
        hook = layer.register_forward_pre_hook(_refuse_the_layer)
        try:
            result = causal_self_attention(x.clone(), layer)
        finally:
            hook.remove()
        d_k = D // H
        slips = {
            "no causal mask: position 0's output depends on later positions; block keys j > i with "
            "subsequent_mask(T) (True above the diagonal)": _by_hand(layer, x, None, math.sqrt(d_k)),
            "the scale is sqrt(d_model); each head divides by sqrt(d_k) = sqrt(d_model / n_heads)":
                _by_hand(layer, x, causal, math.sqrt(D)),
            "no output projection: apply layer.out_proj to the merged heads": _by_hand(layer, x, causal, math.sqrt(d_k), False),
        }
    assert isinstance(result, Tensor), f"causal_self_attention must return a torch.Tensor, got {type(result).__name__}"
    assert result.shape == expected.shape, f"expected shape (B, T, D) = {tuple(expected.shape)}, got {tuple(result.shape)}"
    assert not result.isnan().any(), ("NaN in the output: a query whose keys are all blocked? Query i may attend "
                                      "to keys 0..i, itself included (mask = triu(..., diagonal=1))")
    for message, wrong in slips.items():
        assert not torch.allclose(result, wrong, atol=1e-5, rtol=1e-4), message
    torch.testing.assert_close(result, expected, atol=1e-5, rtol=1e-4, msg=lambda m: (
        "causal_self_attention differs from layer(x, x, x, attn_mask=subsequent_mask(T))[0]; check the head "
        f"split (B, H, T, d_k) and the merge back to (B, T, D): {m}"))


def check_causal_self_attention(your_function) -> bool:
    """Exercise 2 of notebook 05: causal multi-head self-attention from a layer's projections."""
    return run_checker("causal self-attention with H heads", your_function, _check_causal_self_attention)
