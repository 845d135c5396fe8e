"""Tests for transformer_lib.model (notebook 09): the full Transformer equals nn.Transformer (plus our
embeddings and output layer) given the same weights, decodes incrementally as in one pass, ties its
embeddings, has the paper's parameter count, and rejects bad input before computing anything."""
import math
import warnings

import pytest
import torch
from torch import nn

from reference_weights import (DEVICE, FUSED, NORM_FIRST, copy_transformer,
                               count_linear_calls, randomize_norms)
from transformer_lib.attention import subsequent_mask
from transformer_lib.model import Transformer, TransformerConfig, build_transformer, set_inner_dropout
from transformer_lib.multihead import MultiHeadAttention

V, D, H, D_FF, B, S, T, PAD, MAX_LEN = 50, 16, 4, 32, 3, 7, 5, 0, 16


def small_model(**changes) -> Transformer:
    kwargs = dict(d_model=D, n_heads=H, d_ff=D_FF, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                  max_len=MAX_LEN, pad_id=PAD)
    return Transformer(V, V, **{**kwargs, **changes})


@pytest.fixture
def batch():
    """src (B, S) and tgt (B, T) token ids, right-padded, with their padding masks."""
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(1, V, (B, S), generator=generator)
    tgt = torch.randint(1, V, (B, T), generator=generator)
    src[1, 4:] = PAD
    tgt[2, 3:] = PAD
    return src, tgt, src == PAD, tgt == PAD


def reference(norm_first: bool) -> nn.Transformer:
    torch.manual_seed(1)
    with warnings.catch_warnings():   # pre-LN: "enable_nested_tensor is True, but ..." (irrelevant here)
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
        ref = nn.Transformer(D, H, 2, 2, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    if not norm_first:
        ref.encoder.norm = ref.decoder.norm = None   # nn.Transformer always adds them; the post-LN paper model has none
    randomize_norms(ref)
    return ref.eval()


@DEVICE
@FUSED
@NORM_FIRST
def test_matches_nn_transformer(batch, norm_first, fused, device):
    ours = small_model(norm_first=norm_first, fused_attention=fused).eval()
    ref = reference(norm_first)
    copy_transformer(ours, ref)
    ours, ref = ours.to(device), ref.to(device)
    src, tgt, src_pad, tgt_pad = (t.to(device) for t in batch)
    expected = ours.generator(ref(ours.positions(ours.src_embed(src)), ours.positions(ours.tgt_embed(tgt)),
                                  tgt_mask=subsequent_mask(T, device=device), src_key_padding_mask=src_pad,
                                  tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad))
    torch.testing.assert_close(ours(src, tgt, src_pad, tgt_pad), expected)


@FUSED
@NORM_FIRST
def test_cached_decoding_equals_forward(batch, norm_first, fused):
    model = small_model(norm_first=norm_first, fused_attention=fused).eval()
    src, tgt, src_pad, _ = batch
    full = model(src, tgt, src_key_padding_mask=src_pad)
    memory = model.encode(src, src_pad)
    cache = model.new_cache()
    assert len(cache) == len(model.decoder.layers) and all(c == {} for c in cache)
    steps = [model.generator(model.decode(tgt[:, t:t + 1], memory, memory_key_padding_mask=src_pad, cache=cache))
             for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


@NORM_FIRST
def test_later_target_tokens_never_change_earlier_logits(batch, norm_first):
    model = small_model(norm_first=norm_first).eval()
    src, tgt, src_pad, _ = batch
    base = model(src, tgt, src_key_padding_mask=src_pad)
    for j in range(1, T):
        edited = tgt.clone()
        edited[:, j:] = (tgt[:, j:] % (V - 1)) + 1           # other real tokens from position j on
        logits = model(src, edited, src_key_padding_mask=src_pad)
        torch.testing.assert_close(logits[:, :j], base[:, :j])
        assert not torch.allclose(logits[:, j], base[:, j])


def test_padding_content_of_the_source_is_ignored(batch):
    model = small_model().eval()
    src, tgt, src_pad, _ = batch
    other = torch.where(src_pad, torch.randint(1, V, src.shape), src)   # real tokens where the padding was
    torch.testing.assert_close(model(other, tgt, src_key_padding_mask=src_pad),
                               model(src, tgt, src_key_padding_mask=src_pad))


def test_tied_weights_are_one_tensor():
    model = small_model()
    weight = model.src_embed.embedding.weight
    assert model.tgt_embed is model.src_embed
    assert model.generator.weight is weight and model.generator.weight.data_ptr() == weight.data_ptr()
    assert model.generator.bias is None
    assert sum(p.numel() for p in model.parameters()) + 2 * V * D == sum(
        p.numel() for p in small_model(tie_embeddings=False).parameters())


def test_tied_output_layer_is_trained_by_the_embedding_use(batch):
    model = small_model()
    src, _, src_pad, _ = batch
    model.encode(src, src_pad).pow(2).sum().backward()      # the output layer takes no part in this loss
    grad = model.generator.weight.grad
    assert grad is not None and grad[src[0, 0]].abs().sum() > 0
    assert grad[PAD].abs().sum() == 0                       # the padding row gets nothing through the embedding


def test_untied_weights_are_separate_tensors():
    model = Transformer(V, V + 7, D, H, D_FF, 1, 1, tie_embeddings=False)
    assert model.tgt_embed is not model.src_embed
    assert model.generator.weight is not model.tgt_embed.embedding.weight
    assert model.generator.weight.shape == (V + 7, D)


def test_tie_embeddings_with_two_vocabularies_raises():
    with pytest.raises(ValueError, match="tie_embeddings needs one shared vocabulary.*50.*60"):
        Transformer(50, 60, D, H, D_FF, 1, 1, tie_embeddings=True)


def test_initialisation():
    model = Transformer(V, V, d_model=64, n_heads=4, d_ff=256, n_encoder_layers=1, n_decoder_layers=1)
    for weight, fan_in, fan_out in [(model.encoder.layers[0].self_attn.q_proj.weight, 64, 64),
                                    (model.decoder.layers[0].feed_forward.linear1.weight, 64, 256)]:
        bound = math.sqrt(6 / (fan_in + fan_out))             # Glorot/Xavier uniform
        assert weight.abs().max() <= bound
        assert abs(weight.std().item() - bound / math.sqrt(3)) < 0.1 * bound
    embedding = model.src_embed.embedding.weight
    assert abs(embedding[1:].std().item() - 64 ** -0.5) < 0.01   # N(0, 1/d_model)
    assert torch.equal(embedding[PAD], torch.zeros(64))


def test_paper_base_model_parameter_count():
    with torch.device("meta"):                               # shapes only
        tied = build_transformer(TransformerConfig(37000, 37000))
        untied = build_transformer(TransformerConfig(37000, 37000, tie_embeddings=False))
    assert sum(p.numel() for p in tied.parameters()) == 63_082_496
    assert sum(p.numel() for p in untied.parameters()) == 63_082_496 + 2 * 37000 * 512


def test_build_transformer_reads_every_config_field():
    config = TransformerConfig(src_vocab_size=30, tgt_vocab_size=40, d_model=24, n_heads=3, d_ff=40,
                               n_encoder_layers=2, n_decoder_layers=3, dropout=0.2, max_len=20, norm_first=True,
                               tie_embeddings=False, pad_id=4, fused_attention=False, layer_norm_eps=1e-6)
    model = build_transformer(config)
    layer = model.decoder.layers[0]
    assert model.src_embed.embedding.weight.shape == (30, 24) and model.generator.weight.shape == (40, 24)
    assert (layer.self_attn.n_heads, layer.feed_forward.linear1.out_features) == (3, 40)
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (2, 3)
    assert layer.sublayers[0].dropout.p == 0.2 and layer.sublayers[0].norm.eps == 1e-6
    assert model.max_len == 20 and model.pad_id == 4 and model.src_embed.embedding.padding_idx == 4
    assert model.encoder.norm is not None and layer.self_attn.fused is False
    assert model.tgt_embed is not model.src_embed



@pytest.mark.parametrize("attention, activation", [(None, None), (0.0, 0.0), (0.05, None), (None, 0.3)])
def test_inner_dropout_is_set_apart_from_the_model_dropout(attention, activation):
    model = build_transformer(TransformerConfig(30, 30, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                                                n_decoder_layers=2, dropout=0.2, attention_dropout=attention,
                                                activation_dropout=activation))
    layers = [*model.encoder.layers, *model.decoder.layers]
    attention_p = {m.dropout for m in model.modules() if isinstance(m, MultiHeadAttention)}
    hidden_p = {layer.feed_forward.dropout.p for layer in layers}
    assert attention_p == {0.2 if attention is None else attention}
    assert hidden_p == {0.2 if activation is None else activation}
    assert {layer.sublayers[0].dropout.p for layer in layers} == {0.2} and model.positions.dropout.p == 0.2


def test_inner_dropout_without_attention_and_hidden_dropout_changes_nothing_in_eval(batch):
    torch.manual_seed(0)
    plain = small_model()
    paper = small_model()
    paper.load_state_dict(plain.state_dict())
    set_inner_dropout(paper, attention=0.0, activation=0.0)
    src, tgt, src_pad, tgt_pad = batch
    torch.testing.assert_close(paper.eval()(src, tgt, src_pad, tgt_pad), plain.eval()(src, tgt, src_pad, tgt_pad))


@pytest.mark.parametrize("bad", [1.0, -0.1, True, "0.1"])
def test_inner_dropout_must_be_a_probability(bad):
    with pytest.raises(ValueError, match="attention_dropout must be None or a number in"):
        set_inner_dropout(small_model(), attention=bad)
    with pytest.raises(ValueError, match="activation_dropout must be None or a number in"):
        build_transformer(TransformerConfig(30, 30, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                                            n_decoder_layers=1, activation_dropout=bad))


BAD_CALLS = [
    (lambda m, src, tgt, sp, tp: m(src.float(), tgt), TypeError, "src must hold integer token ids.*float32"),
    (lambda m, src, tgt, sp, tp: m(src, tgt.double()), TypeError, "tgt must hold integer token ids"),
    (lambda m, src, tgt, sp, tp: m(src, tgt[:2]), ValueError, "same batch size, got 3 and 2"),
    (lambda m, src, tgt, sp, tp: m(src[0], tgt), ValueError, r"src must have shape \(B, L\)"),
    (lambda m, src, tgt, sp, tp: m(src, tgt, sp[:, :-1]), ValueError, "src_key_padding_mask"),
    (lambda m, src, tgt, sp, tp: m(src, tgt, sp, tp.int()), TypeError, "tgt_key_padding_mask.*bool"),
    (lambda m, src, tgt, sp, tp: m(src, torch.ones(B, MAX_LEN + 1, dtype=torch.long)), ValueError,
     "max_len=16"),
    (lambda m, src, tgt, sp, tp: m.encode(torch.ones(B, MAX_LEN + 1, dtype=torch.long)), ValueError, "max_len=16"),
    (lambda m, src, tgt, sp, tp: m.decode(tgt, torch.zeros(2, S, D)), ValueError, "same batch size, got 3 and 2"),
]


@pytest.mark.parametrize("call, error, message", BAD_CALLS)
def test_bad_input_raises_before_any_matmul(batch, call, error, message):
    model = small_model()
    with count_linear_calls() as calls, pytest.raises(error, match=message):
        call(model, *batch)
    assert calls == []


def test_cached_decoding_stops_at_max_len(batch):
    model = small_model().eval()
    src, _, src_pad, _ = batch
    memory = model.encode(src, src_pad)
    cache = model.new_cache()
    model.decode(torch.ones(B, MAX_LEN, dtype=torch.long), memory, subsequent_mask(MAX_LEN), cache=cache)
    with pytest.raises(ValueError, match="positions 16 .. 16.*max_len=16"):
        model.decode(torch.ones(B, 1, dtype=torch.long), memory, cache=cache)


def test_positional_table_also_rejects_long_input():
    model = small_model()
    with pytest.raises(ValueError, match="max_len"):
        model.positions(torch.zeros(1, MAX_LEN + 1, D))


def test_encoder_decoder_from_parts_is_the_same_model(batch):
    """`Transformer` is an `EncoderDecoder` that builds its parts: the generic class given the same
    parts computes the same logits, and the paper's post-LN model is embed -> encode -> decode -> h E^T."""
    from transformer_lib.model import EncoderDecoder
    model = small_model().eval()
    src, tgt, src_padding, tgt_padding = batch
    parts = EncoderDecoder(model.src_embed, model.tgt_embed, model.positions, model.encoder, model.decoder,
                           model.generator, MAX_LEN).eval()
    expected = model(src, tgt, src_key_padding_mask=src_padding, tgt_key_padding_mask=tgt_padding)
    torch.testing.assert_close(parts(src, tgt, src_key_padding_mask=src_padding, tgt_key_padding_mask=tgt_padding),
                               expected, rtol=0, atol=0)
    memory = model.encoder(model.positions(model.src_embed(src)), src_key_padding_mask=src_padding)
    hidden = model.decoder(model.positions(model.tgt_embed(tgt)), memory, tgt_mask=subsequent_mask(T),
                           tgt_key_padding_mask=tgt_padding, memory_key_padding_mask=src_padding)
    torch.testing.assert_close(hidden @ model.src_embed.embedding.weight.T, expected)
