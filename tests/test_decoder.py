"""Tests for transformer_lib.decoder (notebook 08): DecoderLayer and Decoder are PyTorch's
nn.TransformerDecoderLayer / nn.TransformerDecoder given the same weights, are causal, decode
incrementally with a key/value cache exactly as in one full pass, and reject bad input early."""
import pytest
import torch
from torch import nn

from reference_weights import (DEVICE, FUSED, NORM_FIRST, copy_decoder, copy_decoder_layer,
                               count_linear_calls, randomize_norms)
from transformer_lib.attention import subsequent_mask
from transformer_lib.decoder import Decoder, DecoderLayer

D, H, D_FF, B, S, T = 16, 4, 32, 3, 7, 5


@pytest.fixture
def batch():
    """tgt (B, T, D), memory (B, S, D) and the masks of a padded batch, as a dict of decoder kwargs."""
    generator = torch.Generator().manual_seed(0)
    return dict(
        tgt=torch.randn(B, T, D, generator=generator),
        memory=torch.randn(B, S, D, generator=generator),
        tgt_mask=subsequent_mask(T),
        tgt_key_padding_mask=torch.arange(T)[None] >= torch.tensor([5, 5, 3])[:, None],
        memory_key_padding_mask=torch.arange(S)[None] >= torch.tensor([7, 4, 6])[:, None])


def to(device, kwargs):
    return {k: v.to(device) for k, v in kwargs.items()}


@DEVICE
@FUSED
@NORM_FIRST
def test_layer_matches_torch(batch, norm_first, fused, device):
    torch.manual_seed(1)
    ref = nn.TransformerDecoderLayer(D, H, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    randomize_norms(ref)
    ours = DecoderLayer(D, H, D_FF, dropout=0.0, norm_first=norm_first, fused_attention=fused)
    copy_decoder_layer(ours, ref)
    ours, ref = ours.to(device).eval(), ref.to(device).eval()
    kwargs = to(device, batch)
    torch.testing.assert_close(ours(**kwargs), ref(**kwargs))
    memory_mask = torch.zeros(T, S, dtype=torch.bool, device=device)
    memory_mask[:, 0] = True                                  # no target position may read source position 0
    torch.testing.assert_close(ours(**kwargs, memory_mask=memory_mask), ref(**kwargs, memory_mask=memory_mask))


@DEVICE
@FUSED
@NORM_FIRST
def test_stack_matches_torch(batch, norm_first, fused, device):
    torch.manual_seed(2)
    layer = nn.TransformerDecoderLayer(D, H, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    ref = nn.TransformerDecoder(layer, 3, norm=nn.LayerNorm(D) if norm_first else None)
    randomize_norms(ref)
    ours = Decoder(D, H, D_FF, 3, dropout=0.0, norm_first=norm_first, fused_attention=fused)
    copy_decoder(ours, ref)
    ours, ref = ours.to(device).eval(), ref.to(device).eval()
    kwargs = to(device, batch)
    torch.testing.assert_close(ours(**kwargs), ref(**kwargs))


def test_cross_attention_direction_matters(batch):
    """Queries must come from the decoder: with them taken from the memory the layer is another function."""
    class Swapped(DecoderLayer):
        def _mha_block(self, x, memory, memory_mask, memory_key_padding_mask, cache):
            return self.cross_attn(memory, x, x)[0]

    torch.manual_seed(3)
    ref = nn.TransformerDecoderLayer(D, H, D_FF, dropout=0.0, batch_first=True).eval()
    swapped = Swapped(D, H, D_FF, dropout=0.0).eval()
    copy_decoder_layer(swapped, ref)
    tgt, memory_T = batch["tgt"], torch.randn(B, T, D)        # S == T, so that the swapped layer can run
    assert not torch.allclose(swapped(tgt, memory_T, subsequent_mask(T)), ref(tgt, memory_T, subsequent_mask(T)),
                              atol=1e-2)
    with pytest.raises(RuntimeError):                         # S != T: S output rows cannot join T positions
        swapped(tgt, batch["memory"], subsequent_mask(T))


@FUSED
@NORM_FIRST
def test_later_targets_never_change_earlier_outputs(batch, norm_first, fused):
    decoder = Decoder(D, H, D_FF, 2, dropout=0.0, norm_first=norm_first, fused_attention=fused).eval()
    tgt, memory = batch["tgt"], batch["memory"]
    base = decoder(tgt, memory, subsequent_mask(T))
    for j in range(1, T):
        edited = tgt.clone()
        edited[:, j:] = torch.randn(B, T - j, D)              # new tokens from position j on
        out = decoder(edited, memory, subsequent_mask(T))
        torch.testing.assert_close(out[:, :j], base[:, :j])
        assert not torch.allclose(out[:, j], base[:, j])      # the edited position itself does change


@FUSED
@NORM_FIRST
def test_cache_one_position_at_a_time_equals_full_pass(batch, norm_first, fused):
    decoder = Decoder(D, H, D_FF, 3, dropout=0.0, norm_first=norm_first, fused_attention=fused).eval()
    tgt, memory, memory_padding = batch["tgt"], batch["memory"], batch["memory_key_padding_mask"]
    full = decoder(tgt, memory, subsequent_mask(T), memory_key_padding_mask=memory_padding)
    cache = [{} for _ in decoder.layers]
    steps = [decoder(tgt[:, t:t + 1], memory, memory_key_padding_mask=memory_padding, cache=cache) for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    assert cache[0]["self"]["k"].shape == (B, H, T, D // H)
    assert cache[0]["cross"]["k"].shape == (B, H, S, D // H)


@FUSED
def test_cache_with_a_prefix_then_single_steps(batch, fused):
    """A first call with 3 positions (causal mask (3, 3)), then one position at a time."""
    decoder = Decoder(D, H, D_FF, 2, dropout=0.0, fused_attention=fused).eval()
    tgt, memory = batch["tgt"], batch["memory"]
    full = decoder(tgt, memory, subsequent_mask(T))
    cache = [{} for _ in decoder.layers]
    parts = [decoder(tgt[:, :3], memory, subsequent_mask(3), cache=cache)]
    parts += [decoder(tgt[:, t:t + 1], memory, cache=cache) for t in range(3, T)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full)


def test_cross_attention_cache_is_computed_once(batch):
    decoder = Decoder(D, H, D_FF, 1, dropout=0.0).eval()
    cache = [{}]
    decoder(batch["tgt"][:, :1], batch["memory"], cache=cache)
    cross_k = cache[0]["cross"]["k"]
    decoder(batch["tgt"][:, 1:2], batch["memory"], cache=cache)
    assert cache[0]["cross"]["k"] is cross_k                  # reused, not recomputed
    assert cache[0]["self"]["k"].size(2) == 2                 # self-attention keys grew by one


def test_memory_padding_content_is_ignored(batch):
    decoder = Decoder(D, H, D_FF, 2, dropout=0.0).eval()
    memory, padding = batch["memory"], batch["memory_key_padding_mask"]
    garbage = torch.where(padding[..., None], 1e3 * torch.randn_like(memory), memory)
    kwargs = dict(tgt_mask=batch["tgt_mask"], memory_key_padding_mask=padding)
    torch.testing.assert_close(decoder(batch["tgt"], garbage, **kwargs), decoder(batch["tgt"], memory, **kwargs))


BAD_INPUTS = [
    (dict(memory=torch.randn(2, S, D)), ValueError, "same batch size, got 3 and 2"),
    (dict(tgt_mask=subsequent_mask(T + 1)), ValueError, r"tgt_mask.*\(6, 6\)"),
    (dict(tgt_mask=subsequent_mask(T).float()), TypeError, "tgt_mask.*bool"),
    (dict(memory_key_padding_mask=torch.zeros(B, T, dtype=torch.bool)), ValueError,
     r"memory_key_padding_mask.*\(3, 5\)"),
    (dict(tgt_key_padding_mask=torch.zeros(B, T)), TypeError, "tgt_key_padding_mask.*bool"),
    (dict(memory_mask=torch.zeros(S, T, dtype=torch.bool)), ValueError, "memory_mask"),
    (dict(tgt=torch.randint(0, 9, (B, T))), TypeError, "float vectors"),
    (dict(memory=torch.randn(B, S, D + 1)), ValueError, r"memory must have shape \(B, L, d_model=16\)"),
    (dict(cache=[{}]), ValueError, "one dict per layer"),
]


@pytest.mark.parametrize("override, error, message", BAD_INPUTS)
def test_bad_input_raises_before_any_matmul(batch, override, error, message):
    decoder = Decoder(D, H, D_FF, 2, norm_first=True)
    kwargs = {"tgt": batch["tgt"], "memory": batch["memory"], **override}
    with count_linear_calls() as calls, pytest.raises(error, match=message):
        decoder(**kwargs)
    assert calls == []


def test_layer_cache_must_be_a_dict(batch):
    layer = DecoderLayer(D, H, D_FF)
    with count_linear_calls() as calls, pytest.raises(TypeError, match="cache must be a dict"):
        layer(batch["tgt"], batch["memory"], cache=[])
    assert calls == []


def test_mask_with_cache_must_cover_cached_positions(batch):
    decoder = Decoder(D, H, D_FF, 1, dropout=0.0).eval()
    cache = [{}]
    decoder(batch["tgt"][:, :2], batch["memory"], subsequent_mask(2), cache=cache)
    with pytest.raises(ValueError, match="tgt_mask"):     # must be (1, 3): 1 new query, 2 cached + 1 new keys
        decoder(batch["tgt"][:, 2:3], batch["memory"], subsequent_mask(1), cache=cache)
