"""Tests for transformer_lib.encoder (notebook 07): EncoderLayer and Encoder are PyTorch's
nn.TransformerEncoderLayer / nn.TransformerEncoder given the same weights, and reject bad input early."""
import pytest
import torch
from torch import nn

from reference_weights import (DEVICE, FUSED, NORM_FIRST, copy_encoder, copy_encoder_layer,
                               count_linear_calls, randomize_norms)
from transformer_lib.encoder import Encoder, EncoderLayer

D, H, D_FF, B, S = 16, 4, 32, 3, 6


@pytest.fixture
def batch():
    """src (B, S, D) and a padding mask (B, S) with sequences of 6, 4 and 2 real positions."""
    generator = torch.Generator().manual_seed(0)
    src = torch.randn(B, S, D, generator=generator)
    padding = torch.arange(S)[None] >= torch.tensor([6, 4, 2])[:, None]
    return src, padding


def reference_layer(norm_first: bool) -> nn.TransformerEncoderLayer:
    torch.manual_seed(1)
    ref = nn.TransformerEncoderLayer(D, H, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    randomize_norms(ref)
    return ref.eval()


@DEVICE
@FUSED
@NORM_FIRST
def test_layer_matches_torch(batch, norm_first, fused, device):
    ref = reference_layer(norm_first).to(device)
    ours = EncoderLayer(D, H, D_FF, dropout=0.0, norm_first=norm_first, fused_attention=fused).eval()
    copy_encoder_layer(ours, ref)
    ours.to(device)
    src, padding = (t.to(device) for t in batch)
    attn_mask = torch.zeros(S, S, dtype=torch.bool, device=device)
    attn_mask[:, 1] = True                                   # nobody may attend to position 1
    for mask, pad in [(None, None), (None, padding), (attn_mask, padding)]:
        torch.testing.assert_close(ours(src, mask, pad), ref(src, src_mask=mask, src_key_padding_mask=pad))


@FUSED
@NORM_FIRST
def test_layer_gradients_match_torch(batch, norm_first, fused):
    ref = reference_layer(norm_first)
    ours = EncoderLayer(D, H, D_FF, dropout=0.0, norm_first=norm_first, fused_attention=fused)
    copy_encoder_layer(ours, ref)
    src, padding = batch
    grads = []
    for module, call in [(ours, lambda x: ours(x, src_key_padding_mask=padding)),
                         (ref, lambda x: ref(x, src_key_padding_mask=padding))]:
        x = src.clone().requires_grad_()
        call(x).pow(2).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(ours.feed_forward.linear1.weight.grad, ref.linear1.weight.grad)


@DEVICE
@FUSED
@NORM_FIRST
def test_stack_matches_torch(batch, norm_first, fused, device):
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(D, H, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    # enable_nested_tensor=False: otherwise, in eval mode without grad, PyTorch returns zeros at padded positions.
    ref = nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(D) if norm_first else None, enable_nested_tensor=False)
    randomize_norms(ref)
    ours = Encoder(D, H, D_FF, 3, dropout=0.0, norm_first=norm_first, fused_attention=fused)
    copy_encoder(ours, ref)
    ours, ref = ours.to(device).eval(), ref.to(device).eval()
    src, padding = (t.to(device) for t in batch)
    with torch.no_grad():
        torch.testing.assert_close(ours(src, src_key_padding_mask=padding), ref(src, src_key_padding_mask=padding))


@NORM_FIRST
def test_final_norm_only_for_pre_ln(norm_first):
    encoder = Encoder(D, H, D_FF, 2, norm_first=norm_first)
    assert (encoder.norm is not None) == norm_first
    assert len(encoder.layers) == 2 and encoder.layers[0] is not encoder.layers[1]
    assert encoder.layers[0].self_attn.q_proj.weight.data_ptr() != encoder.layers[1].self_attn.q_proj.weight.data_ptr()


@FUSED
def test_padding_content_is_ignored(batch, fused):
    encoder = Encoder(D, H, D_FF, 2, dropout=0.0, fused_attention=fused).eval()
    src, padding = batch
    garbage = torch.where(padding[..., None], 1e3 * torch.randn_like(src), src)
    real = ~padding
    torch.testing.assert_close(encoder(garbage, src_key_padding_mask=padding)[real],
                               encoder(src, src_key_padding_mask=padding)[real])
    # ...and the mask is what makes it so: without it the real positions change
    assert not torch.allclose(encoder(garbage)[real], encoder(src)[real])


def test_dropout_is_active_only_in_training(batch):
    encoder = Encoder(D, H, D_FF, 2, dropout=0.5)
    src, _ = batch
    torch.manual_seed(3)
    first, second = encoder(src), encoder(src)
    assert not torch.allclose(first, second)
    encoder.eval()
    torch.testing.assert_close(encoder(src), encoder(src))


BAD_INPUTS = [
    (lambda src, pad: dict(src_key_padding_mask=pad.float()), TypeError, "src_key_padding_mask.*bool"),
    (lambda src, pad: dict(src_key_padding_mask=pad[:, :-1]), ValueError, r"src_key_padding_mask.*\(3, 5\)"),
    # the stack's errors name its own argument `mask`, not the layers' `src_mask`
    (lambda src, pad: dict(mask=torch.ones(S, S + 1, dtype=torch.bool)), ValueError, r"^mask: .*\(6, 7\)"),
    (lambda src, pad: dict(mask=torch.zeros(S, S)), TypeError, "^mask: .*bool"),
    (lambda src, pad: dict(src=torch.randint(0, 9, (B, S))), TypeError, "float vectors.*embedding"),
    (lambda src, pad: dict(src=src[..., :-1]), ValueError, r"d_model=16.*\(3, 6, 15\)"),
    (lambda src, pad: dict(src=src[0]), ValueError, r"\(B, L, d_model=16\)"),
]


@pytest.mark.parametrize("make_kwargs, error, message", BAD_INPUTS)
def test_bad_input_raises_before_any_matmul(batch, make_kwargs, error, message):
    encoder = Encoder(D, H, D_FF, 2, norm_first=True)
    src, padding = batch
    kwargs = {"src": src, **make_kwargs(src, padding)}
    with count_linear_calls() as calls, pytest.raises(error, match=message):
        encoder(**kwargs)
    assert calls == []


@pytest.mark.parametrize("bad_mask, error, message", [
    (torch.ones(S, S + 1, dtype=torch.bool), ValueError, r"^src_mask: .*\(6, 7\)"),
    (torch.zeros(S, S), TypeError, "^src_mask: .*bool"),
])
def test_layer_errors_name_its_own_mask_argument(batch, bad_mask, error, message):
    layer = EncoderLayer(D, H, D_FF)
    src, _ = batch
    with count_linear_calls() as calls, pytest.raises(error, match=message):
        layer(src, src_mask=bad_mask)
    assert calls == []


@pytest.mark.parametrize("n_layers", [0, -1, 2.5, True, "6"])
def test_bad_n_layers(n_layers):
    with pytest.raises(ValueError, match="n_layers must be a positive int"):
        Encoder(D, H, D_FF, n_layers)


def test_bad_sizes_are_rejected_at_construction():
    with pytest.raises(ValueError, match="divisible"):
        EncoderLayer(D, 5, D_FF)
    with pytest.raises(ValueError, match="dropout"):
        EncoderLayer(D, H, D_FF, dropout=1.0)
