"""Copy the weights of PyTorch's reference modules into ours, so that both compute the same function.

Shared by tests/test_encoder.py, tests/test_decoder.py and tests/test_model.py (not a test file itself),
together with `count_linear_calls`, which proves that a bad input is rejected before any matrix product.
The correspondence:

    nn.MultiheadAttention.in_proj_weight (3D, D), rows [0, D) / [D, 2D) / [2D, 3D)  ->  q_proj / k_proj / v_proj
    nn.MultiheadAttention.out_proj                                                  ->  out_proj
    nn.Transformer{Encoder,Decoder}Layer.linear1 / linear2                          ->  feed_forward.linear1 / linear2
    nn.TransformerEncoderLayer.norm1 / norm2                                        ->  sublayers[0] / [1].norm
    nn.TransformerDecoderLayer.norm1 / norm2 / norm3                                ->  sublayers[0] / [1] / [2].norm
    nn.TransformerDecoderLayer.multihead_attn                                       ->  cross_attn
    nn.TransformerEncoder / nn.TransformerDecoder .norm (pre-LN)                    ->  Encoder / Decoder .norm
"""
from contextlib import contextmanager

import pytest
import torch
from torch import nn

# The variants every model-side equivalence test runs over.
NORM_FIRST = pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
FUSED = pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
DEVICE = pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])


def copy_attention(ours, ref: nn.MultiheadAttention) -> None:
    """nn.MultiheadAttention (packed q/k/v projection) -> our MultiHeadAttention (three Linears)."""
    D = ref.embed_dim
    with torch.no_grad():
        for i, proj in enumerate([ours.q_proj, ours.k_proj, ours.v_proj]):
            proj.weight.copy_(ref.in_proj_weight[i * D:(i + 1) * D])
            proj.bias.copy_(ref.in_proj_bias[i * D:(i + 1) * D])
        ours.out_proj.load_state_dict(ref.out_proj.state_dict())


def _copy_feed_forward(ours, ref) -> None:
    ours.feed_forward.linear1.load_state_dict(ref.linear1.state_dict())
    ours.feed_forward.linear2.load_state_dict(ref.linear2.state_dict())


def copy_encoder_layer(ours, ref: nn.TransformerEncoderLayer) -> None:
    copy_attention(ours.self_attn, ref.self_attn)
    _copy_feed_forward(ours, ref)
    for sublayer, ref_norm in zip(ours.sublayers, [ref.norm1, ref.norm2], strict=True):
        sublayer.norm.load_state_dict(ref_norm.state_dict())


def copy_decoder_layer(ours, ref: nn.TransformerDecoderLayer) -> None:
    copy_attention(ours.self_attn, ref.self_attn)
    copy_attention(ours.cross_attn, ref.multihead_attn)
    _copy_feed_forward(ours, ref)
    for sublayer, ref_norm in zip(ours.sublayers, [ref.norm1, ref.norm2, ref.norm3], strict=True):
        sublayer.norm.load_state_dict(ref_norm.state_dict())


def _copy_final_norm(ours, ref) -> None:
    if (ours.norm is None) != (ref.norm is None):
        raise ValueError(f"final norms differ: ours {ours.norm is not None}, reference {ref.norm is not None}")
    if ref.norm is not None:
        ours.norm.load_state_dict(ref.norm.state_dict())


def copy_encoder(ours, ref: nn.TransformerEncoder) -> None:
    for our_layer, ref_layer in zip(ours.layers, ref.layers, strict=True):
        copy_encoder_layer(our_layer, ref_layer)
    _copy_final_norm(ours, ref)


def copy_decoder(ours, ref: nn.TransformerDecoder) -> None:
    for our_layer, ref_layer in zip(ours.layers, ref.layers, strict=True):
        copy_decoder_layer(our_layer, ref_layer)
    _copy_final_norm(ours, ref)


def copy_transformer(ours, ref: nn.Transformer) -> None:
    """Both stacks of an nn.Transformer into our Transformer (embeddings and generator are ours alone).

    For post-LN, set `ref.encoder.norm = ref.decoder.norm = None` first: nn.Transformer always adds a
    final LayerNorm, the paper's post-LN model has none.
    """
    copy_encoder(ours.encoder, ref.encoder)
    copy_decoder(ours.decoder, ref.decoder)


def randomize_norms(module: nn.Module, generator: torch.Generator | None = None) -> None:
    """Give every LayerNorm of a reference module non-trivial weights, so that copying them matters."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=generator))
                m.bias.copy_(torch.rand(m.bias.shape, generator=generator) - 0.5)


@contextmanager
def count_linear_calls():
    """Count calls of F.linear (every nn.Linear goes through it) inside the block: yields a list
    that gets one entry per call. Every path through our models starts with a Linear projection, so
    an empty list after an exception means the input was rejected before any matrix product."""
    calls = []
    real_linear = torch.nn.functional.linear

    def spy(*args, **kwargs):
        calls.append(1)
        return real_linear(*args, **kwargs)

    torch.nn.functional.linear = spy
    try:
        yield calls
    finally:
        torch.nn.functional.linear = real_linear
