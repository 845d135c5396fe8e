"""Scaled dot-product attention (notebook 04): equal to PyTorch's, masks, and fully blocked rows."""
import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import merge_masks, scaled_dot_product_attention, subsequent_mask

B, H, LQ, LK, DK, DV = 2, 3, 5, 6, 8, 4


@pytest.fixture
def qkv():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(B, H, LQ, DK, generator=generator)
    key = torch.randn(B, H, LK, DK, generator=generator)
    value = torch.randn(B, H, LK, DV, generator=generator)
    return query, key, value


def _padding(lengths=(6, 3)):
    return torch.arange(LK)[None, :] >= torch.tensor(lengths)[:, None]  # (B, Lk): True = padding


def _causal():
    return torch.ones(LQ, LK, dtype=torch.bool).triu(diagonal=1)        # (Lq, Lk)


MASKS = {
    "none": lambda: None,
    "causal": lambda: merge_masks(_causal(), None, B, LQ, LK),
    "padding": lambda: merge_masks(None, _padding(), B, LQ, LK),
    "both": lambda: merge_masks(_causal(), _padding(), B, LQ, LK),
}


def test_subsequent_mask_is_strict_upper_triangle():
    mask = subsequent_mask(4)
    assert mask.dtype == torch.bool and mask.shape == (4, 4)
    assert torch.equal(mask, torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool))


@pytest.mark.parametrize("size", [0, -2, 2.0, True])
def test_subsequent_mask_rejects_bad_size(size):
    with pytest.raises(ValueError, match="size must be a positive int"):
        subsequent_mask(size)


def test_merge_masks_combines_with_or():
    mask = merge_masks(_causal(), _padding(), B, LQ, LK)
    assert mask.shape == (B, 1, LQ, LK)
    expected = _causal()[None] | _padding()[:, None, :]                 # (B, Lq, Lk)
    assert torch.equal(mask[:, 0], expected)
    assert merge_masks(None, None, B, LQ, LK) is None
    per_batch = torch.zeros(B, LQ, LK, dtype=torch.bool)
    assert merge_masks(per_batch, None, B, LQ, LK).shape == (B, 1, LQ, LK)


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("fused", [False, True])
def test_equals_torch_sdpa(qkv, mask_name, fused):
    query, key, value = qkv
    mask = MASKS[mask_name]()
    out, weights = scaled_dot_product_attention(query, key, value, mask, fused=fused)
    # PyTorch's boolean mask means "takes part": invert ours.
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=None if mask is None else ~mask)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    if fused:
        assert weights is None
    else:
        assert weights.shape == (B, H, LQ, LK)
        torch.testing.assert_close(weights.sum(dim=-1), torch.ones(B, H, LQ))
        if mask is not None:
            assert (weights.masked_select(mask.expand_as(weights)) == 0).all()


def test_brute_force_loop():
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)  # (B, Lq, d_k)
    key = torch.randn(2, 5, 4, generator=generator, dtype=torch.float64)    # (B, Lk, d_k)
    value = torch.randn(2, 5, 2, generator=generator, dtype=torch.float64)  # (B, Lk, d_v)
    mask = torch.zeros(2, 3, 5, dtype=torch.bool)
    mask[0, :, 4] = True                     # batch 0: key 4 is padding
    mask[1, 0, 1:] = True                    # batch 1, query 0: only key 0
    out, weights = scaled_dot_product_attention(query, key, value, mask)
    expected = torch.zeros(2, 3, 2, dtype=torch.float64)
    for b in range(2):
        for i in range(3):
            allowed = [j for j in range(5) if not mask[b, i, j]]
            scores = [sum(query[b, i, c].item() * key[b, j, c].item() for c in range(4)) / math.sqrt(4)
                      for j in allowed]
            top = max(scores)
            exps = [math.exp(s - top) for s in scores]
            for j, e in zip(allowed, exps):
                expected[b, i] += e / sum(exps) * value[b, j]
                assert weights[b, i, j].item() == pytest.approx(e / sum(exps), abs=1e-12)
    torch.testing.assert_close(out, expected)
    assert weights[1, 0, 0].item() == pytest.approx(1.0)


@pytest.mark.parametrize("fused", [False, True])
def test_fully_blocked_row_gives_zeros_and_finite_gradients(qkv, fused):
    query, key, value = (t.clone().requires_grad_() for t in qkv)
    mask = merge_masks(_causal(), _padding(), B, LQ, LK).clone()
    mask[1, 0, 2] = True                     # batch 1, query 2: every key blocked
    out, weights = scaled_dot_product_attention(query, key, value, mask, fused=fused)
    assert torch.isfinite(out).all()
    assert (out[1, :, 2] == 0).all()
    if not fused:
        assert (weights[1, :, 2] == 0).all()
        torch.testing.assert_close(weights[0].sum(dim=-1), torch.ones(H, LQ))
    out.pow(2).sum().backward()
    for tensor in (query, key, value):
        assert torch.isfinite(tensor.grad).all()
    assert (query.grad[1, :, 2] == 0).all()
    # The rows with allowed keys are untouched by the special case.
    reference = F.scaled_dot_product_attention(*qkv, attn_mask=~mask)
    torch.testing.assert_close(out[0], reference[0], atol=1e-6, rtol=1e-5)


def test_fused_equals_explicit_gradients(qkv):
    mask = MASKS["both"]()
    grads = []
    for fused in (False, True):
        query = qkv[0].clone().requires_grad_()
        out, _ = scaled_dot_product_attention(query, qkv[1], qkv[2], mask, fused=fused)
        out.pow(2).sum().backward()
        grads.append(query.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_dropout_only_when_asked(qkv):
    out, _ = scaled_dot_product_attention(*qkv)
    dropped, _ = scaled_dot_product_attention(*qkv, dropout_p=0.5)
    assert not torch.allclose(out, dropped)


def test_float_mask_is_rejected(qkv):
    additive = torch.zeros(LQ, LK).masked_fill(_causal(), float("-inf"))
    with pytest.raises(TypeError, match="bool tensor with True = blocked"):
        scaled_dot_product_attention(*qkv, mask=additive)
    with pytest.raises(TypeError, match="attn_mask must be a bool tensor"):
        merge_masks(additive, None, B, LQ, LK)
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        merge_masks(None, _padding().float(), B, LQ, LK)


def test_wrong_mask_shape_names_expected_shape(qkv):
    with pytest.raises(ValueError, match=r"broadcastable to .*\(2, 3, 5, 6\), got \(6, 5\)"):
        scaled_dot_product_attention(*qkv, mask=torch.zeros(LK, LQ, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask must have shape \(Lq, Lk\)=\(5, 6\)"):
        merge_masks(torch.zeros(LQ, LQ, dtype=torch.bool), None, B, LQ, LK)
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Lk\)=\(2, 6\)"):
        merge_masks(None, torch.zeros(B, LQ, dtype=torch.bool), B, LQ, LK)


def test_bad_inputs(qkv):
    query, key, value = qkv
    with pytest.raises(ValueError, match="same last dimension d_k"):
        scaled_dot_product_attention(query[..., :4], key, value)
    with pytest.raises(ValueError, match="same number of positions Lk"):
        scaled_dot_product_attention(query, key, value[:, :, :3])
    with pytest.raises(ValueError, match=r"dropout_p must be a float in \[0, 1\)"):
        scaled_dot_product_attention(query, key, value, dropout_p=1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_cuda_fused_equals_explicit(qkv, mask_name):
    query, key, value = (t.cuda() for t in qkv)
    mask = MASKS[mask_name]()
    mask = None if mask is None else mask.cuda()
    explicit, _ = scaled_dot_product_attention(query, key, value, mask)
    fused, _ = scaled_dot_product_attention(query, key, value, mask, fused=True)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(explicit.cpu(), scaled_dot_product_attention(*qkv, MASKS[mask_name]())[0],
                               atol=1e-5, rtol=1e-4)
