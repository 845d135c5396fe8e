"""The checkers of notebook 05's exercises: plausible slips -> a message
that names them, a right answer -> True.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import math

import pytest

from transformer_lib.attention import subsequent_mask
from transformer_lib.exercises.multihead import check_causal_self_attention, check_split_heads
from transformer_lib.multihead import split_heads


def split_right(x, n_heads):
    B, L, D = x.shape
    return x.view(B, L, n_heads, D // n_heads).transpose(1, 2)


def causal_right(x, layer, scale=None, mask=True, out_proj=True):
    B, T, D = x.shape
    H = layer.n_heads
    q, k, v = (p(x).view(B, T, H, D // H).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    scores = q @ k.transpose(-2, -1) / (scale or math.sqrt(D // H))          # (B, H, T, T)
    if mask:
        scores = scores.masked_fill(subsequent_mask(T), float("-inf"))
    out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, D)      # (B, T, D)
    return layer.out_proj(out) if out_proj else out


@pytest.mark.parametrize("check, right", [(check_split_heads, split_right), (check_split_heads, split_heads),
                                          (check_causal_self_attention, causal_right)])
def test_right_answer_passes(check, right, capsys):
    assert check(right) is True
    assert capsys.readouterr().out.startswith("correct: ")


@pytest.mark.parametrize("wrong, message", [
    (lambda x, h: x.view(x.size(0), h, x.size(1), -1), r"mixes positions and features"),
    (lambda x, h: x.view(x.size(0), x.size(1), h, -1), r"transpose\(1, 2\)"),
    (lambda x, h: x.view(x.size(0), x.size(1), -1, 2).transpose(1, 2), "for n_heads=2"),  # d_k fixed at 2
    (lambda x, h: x.view(x.size(0), x.size(1), -1, h).transpose(1, 2).transpose(2, 3).transpose(2, 3)
     .reshape(x.size(0), h, x.size(1), -1).flip(1), "head i must hold features"),
])
def test_split_heads_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_split_heads(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, layer: causal_right(x, layer, mask=False), "no causal mask"),
    (lambda x, layer: causal_right(x, layer, scale=math.sqrt(x.size(-1))), "sqrt\\(d_model\\)"),
    (lambda x, layer: causal_right(x, layer, out_proj=False), "no output projection"),
    (lambda x, layer: layer(x, x, x, attn_mask=subsequent_mask(x.size(1)))[0], "called the layer itself"),
    (lambda x, layer: causal_right(x, layer)[:, :-1], "expected shape"),
])
def test_causal_self_attention_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_causal_self_attention(wrong)
