"""The checkers of notebook 05's exercises: plausible slips -> a message
that names them, right answers (several ways of writing them) -> "correct".
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import math

import pytest
import torch

from transformer_lib.attention import subsequent_mask
from transformer_lib.exercises.multihead import check_causal_self_attention, check_split_heads
from transformer_lib.multihead import split_heads


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



def split_right(x, n_heads):
    B, L, D = x.shape
    return x.view(B, L, n_heads, D // n_heads).transpose(1, 2)


def split_reshape_permute(x, n_heads):
    return x.reshape(*x.shape[:2], n_heads, -1).permute(0, 2, 1, 3)


def split_by_slicing(x, n_heads):
    d_k = x.size(-1) // n_heads
    return torch.stack([x[..., h * d_k:(h + 1) * d_k] for h in range(n_heads)], dim=1)


def causal_right(x, layer, scale=None, mask="causal", out_proj=True, dim=-1, split="right", merge="right"):
    B, T, D = x.shape
    H = layer.n_heads
    if split == "right":
        q, k, v = (p(x).view(B, T, H, D // H).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    else:
        q, k, v = (p(x).reshape(B, H, T, D // H) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    scores = q @ k.transpose(-2, -1) / (scale or math.sqrt(D // H))          # (B, H, T, T)
    blocked = {"causal": subsequent_mask(T), "none": None,
               "diagonal=2": torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=2),
               "diagonal=0": torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=0),
               "tril": torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1),
               "inverted": ~subsequent_mask(T)}[mask]
    if blocked is not None:
        scores = scores.masked_fill(blocked, float("-inf"))
    out = scores.softmax(dim=dim) @ v                                         # (B, H, T, d_k)
    out = out.transpose(1, 2).reshape(B, T, D) if merge == "right" else out.reshape(B, T, D)
    return layer.out_proj(out) if out_proj else out


def causal_additive_float64(x, layer):
    """Another right answer: an additive -inf mask, float64 inside, float32 out, einsum."""
    B, T, D = x.shape
    H = layer.n_heads
    q, k, v = (split_heads(p(x).double(), H) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    bias = torch.zeros(T, T, dtype=torch.float64).masked_fill(subsequent_mask(T), float("-inf"))
    weights = (torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(D // H) + bias).softmax(-1)
    out = torch.einsum("bhts,bhsd->bhtd", weights, v).transpose(1, 2).reshape(B, T, D).float()
    return layer.out_proj(out)


@pytest.mark.parametrize("check, right", [(check_split_heads, split_right),
                                          (check_split_heads, split_reshape_permute),
                                          (check_split_heads, split_by_slicing),
                                          (check_causal_self_attention, causal_right),
                                          (check_causal_self_attention, causal_additive_float64)])
def test_right_answers_pass(check, right):
    assert accepted(check, right)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, h: x.view(x.size(0), h, x.size(1), -1), r"mixes positions and features"),
    (lambda x, h: x.view(x.size(0), x.size(1), h, -1), r"transpose\(1, 2\)"),
    (lambda x, h: x.view(x.size(0), x.size(1), -1, 2).transpose(1, 2), "for n_heads=2|pieces of SIZE"),  # d_k fixed at 2
    (lambda x, h: x.view(x.size(0), x.size(1), -1, h).transpose(1, 2).transpose(2, 3).transpose(2, 3)
     .reshape(x.size(0), h, x.size(1), -1).flip(1), "head i must hold features|head i holds features"),
    (lambda x, h: x.view(x.size(0), x.size(1), -1, h).permute(0, 3, 1, 2), r"features as \(d_k, H\)"),
    (lambda x, h: split_right(x, h).reshape(-1, x.size(1), x.size(2) // h), r"\(B·H, L, d_k\)"),
    (lambda x, h: x.view(x.size(0), x.size(1), h, x.size(2) // h - 1).transpose(1, 2), "raised RuntimeError"),
])
def test_split_heads_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_split_heads(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, layer: causal_right(x, layer, mask="none"), "no causal mask"),
    (lambda x, layer: causal_right(x, layer, mask="diagonal=2"), "off by one: query i also sees key i \\+ 1"),
    (lambda x, layer: causal_right(x, layer, mask="diagonal=0"), "diagonal is blocked too.*attend to itself"),
    (lambda x, layer: causal_right(x, layer, mask="inverted"), "mask is inverted"),
    (lambda x, layer: causal_right(x, layer, mask="tril"), "blocks the PAST"),
    (lambda x, layer: causal_right(x, layer, scale=math.sqrt(x.size(-1))), "sqrt\\(d_model\\)"),
    (lambda x, layer: causal_right(x, layer, scale=1.0), "not scaled"),
    (lambda x, layer: causal_right(x, layer, out_proj=False), "no output projection"),
    (lambda x, layer: causal_right(x, layer, dim=-2), "over the queries"),
    (lambda x, layer: causal_right(x, layer, split="view"), "split with a view"),
    (lambda x, layer: causal_right(x, layer, merge="view"), "merged with a reshape"),
    (lambda x, layer: layer(x, x, x, attn_mask=subsequent_mask(x.size(1)))[0], "called the layer itself"),
    (lambda x, layer: causal_right(x, layer)[:, :-1], "axis T has size 4 where 5 is expected"),
    (lambda x, layer: 1.01 * causal_right(x, layer), "1.01 times the right one"),
])
def test_causal_self_attention_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_causal_self_attention(wrong)


def split_memorised(x, n_heads):
    """A table of the fixed cases' shapes: d_k written as a number."""
    return x.view(x.size(0), x.size(1), n_heads, {8: 2, 6: 3}[x.size(2)]).transpose(1, 2)


@pytest.mark.parametrize("wrong, message", [
    (split_heads, "the course's own function"),
    (split_memorised, "KeyError|for n_heads"),
])
def test_split_heads_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_split_heads(wrong)


def causal_fused(x, layer):
    B, T, D = x.shape
    q, k, v = (split_heads(p(x), layer.n_heads) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return layer.out_proj(out.transpose(1, 2).reshape(B, T, D))


def causal_edits_weights(x, layer):
    with torch.no_grad():
        layer.out_proj.bias.zero_()
    return causal_right(x, layer)


@pytest.mark.parametrize("wrong, message", [
    (causal_fused, "F.scaled_dot_product_attention does the attention in one fused call"),
    (causal_edits_weights, "changed its input `layer` in place"),
])
def test_causal_self_attention_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_causal_self_attention(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, layer: causal_right(x, layer, scale=math.sqrt(layer.n_heads)), "sqrt\\(n_heads\\)"),
])
def test_causal_self_attention_scale_by_heads_is_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_causal_self_attention(wrong)


# ---------------------------------------------------------------- fresh4: queries, biases, heads, library calls
def causal_from(x, layer, query=None, bias=True, heads=None, query_scale=1.0):
    """causal_right with the queries from another projection, the biases left out, a fixed number of heads, or
    the queries scaled (a slip no catalogue lists: only the scores change)."""
    B, T, D = x.shape
    H = heads or layer.n_heads
    project = (lambda p: p(x)) if bias else (lambda p: x @ p.weight.T)
    q, k, v = (project(p).view(B, T, H, D // H).transpose(1, 2)
               for p in (query or layer.q_proj, layer.k_proj, layer.v_proj))
    scores = (query_scale * q) @ k.transpose(-2, -1) / math.sqrt(D // H)
    out = scores.masked_fill(subsequent_mask(T), float("-inf")).softmax(dim=-1) @ v
    return layer.out_proj(out.transpose(1, 2).reshape(B, T, D))


def causal_by_torch(x, layer):
    T = x.size(1)
    weights = [layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]
    biases = [layer.q_proj.bias, layer.k_proj.bias, layer.v_proj.bias]
    out, _ = torch.nn.functional.multi_head_attention_forward(
        x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), x.size(-1), layer.n_heads, torch.cat(weights),
        torch.cat(biases), None, None, False, 0.0, layer.out_proj.weight, layer.out_proj.bias, training=False,
        attn_mask=subsequent_mask(T), need_weights=False)
    return out.transpose(0, 1)


def causal_by_torch_module(x, layer):
    mha = torch.nn.MultiheadAttention(x.size(-1), layer.n_heads, batch_first=True)
    return mha(x, x, x, attn_mask=subsequent_mask(x.size(1)))[0]


@pytest.mark.parametrize("wrong, message", [
    (lambda x, layer: causal_from(x, layer, query=layer.k_proj), "the queries came from layer.k_proj"),
    (lambda x, layer: causal_from(x, layer, bias=False), "the biases of q_proj, k_proj and v_proj are missing"),
    (lambda x, layer: causal_from(x, layer, heads=4), "you split into 4 heads; this layer has layer.n_heads = 2"),
    (lambda x, layer: causal_from(x, layer, query_scale=1.5), "position 0 has one key.*checks only the values.*q_proj"),
    (causal_by_torch, "plain tensor operations .* F.multi_head_attention_forward does the whole of it"),
    (causal_by_torch_module, "nn.MultiheadAttention does the whole of it"),
    (lambda x, layer: layer.forward(x, x, x, attn_mask=subsequent_mask(x.size(1)))[0], "called the layer's forward"),
])
def test_causal_self_attention_projection_slips_and_library_calls_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_causal_self_attention(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, n_heads: x.reshape(x.size(1), x.size(0), n_heads, -1).transpose(1, 2), r"you read x.shape as \(L, B, D\)"),
    (lambda x, n_heads: torch.stack(x.chunk(n_heads, dim=1), dim=1), "you cut x along the positions L"),
])
def test_split_heads_misread_shapes_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_split_heads(wrong)
