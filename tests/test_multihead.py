"""Multi-head attention (notebook 05): equal to nn.MultiheadAttention, key/value cache, errors."""
import pytest
import torch
from torch import nn

from reference_weights import copy_attention, count_linear_calls
from transformer_lib.attention import subsequent_mask
from transformer_lib.multihead import MultiHeadAttention, merge_heads, split_heads

B, S, T, D, H = 3, 7, 5, 16, 4


@pytest.fixture
def inputs():
    generator = torch.Generator().manual_seed(0)
    src = torch.randn(B, S, D, generator=generator)                          # (B, S, D)
    tgt = torch.randn(B, T, D, generator=generator)                          # (B, T, D)
    src_padding = torch.arange(S)[None, :] >= torch.tensor([7, 4, 2])[:, None]  # (B, S)
    return src, tgt, src_padding


@pytest.fixture
def pair():
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(D, H, batch_first=True).eval()
    layers = {}
    for fused in (False, True):
        layers[fused] = MultiHeadAttention(D, H, fused=fused).eval()
        copy_attention(layers[fused], reference)
    return reference, layers


def _case(kind, masks, inputs):
    src, tgt, src_padding = inputs
    if kind == "self":
        query, memory, attn_mask = src, src, subsequent_mask(S)
    else:  # cross: Lq = T differs from Lk = S; row i may see keys 0..i+1
        query, memory, attn_mask = tgt, src, torch.ones(T, S, dtype=torch.bool).triu(diagonal=2)
    return query, memory, (attn_mask if "attn" in masks else None), (src_padding if "padding" in masks else None)


def test_split_and_merge_heads():
    x = torch.arange(2 * 3 * 8.0).view(2, 3, 8)                              # (B, L, D)
    heads = split_heads(x, 4)                                                # (B, H, L, d_k)
    assert heads.shape == (2, 4, 3, 2)
    assert torch.equal(heads[1, 2, 0], x[1, 0, 4:6])                         # head 2 = features 4..5
    assert torch.equal(merge_heads(heads), x)


@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("masks", ["none", "attn", "padding", "attn+padding"])
@pytest.mark.parametrize("fused", [False, True])
def test_equals_nn_multihead_attention(pair, inputs, kind, masks, fused):
    reference, layers = pair
    query, memory, attn_mask, key_padding_mask = _case(kind, masks, inputs)
    with torch.no_grad():
        expected, expected_weights = reference(query, memory, memory, attn_mask=attn_mask,
                                               key_padding_mask=key_padding_mask,
                                               need_weights=True, average_attn_weights=False)
        out, _ = layers[fused](query, memory, memory, attn_mask, key_padding_mask)
        out_with_weights, weights = layers[fused](query, memory, memory, attn_mask, key_padding_mask,
                                                  need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out_with_weights, expected, atol=1e-5, rtol=1e-4)
    assert weights.shape == (B, H, query.size(1), memory.size(1))
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-4)


def test_gradients_equal_nn_multihead_attention(pair, inputs):
    reference, layers = pair
    query, memory, attn_mask, key_padding_mask = _case("cross", "attn+padding", inputs)
    reference(query, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
              need_weights=False)[0].pow(2).sum().backward()
    layers[False](query, memory, memory, attn_mask, key_padding_mask)[0].pow(2).sum().backward()
    w_q_grad = reference.in_proj_weight.grad.chunk(3)[0]
    torch.testing.assert_close(layers[False].q_proj.weight.grad, w_q_grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(layers[False].out_proj.weight.grad, reference.out_proj.weight.grad,
                               atol=1e-5, rtol=1e-4)


def test_keep_weights_stores_last_weights(inputs):
    src, _, src_padding = inputs
    layer = MultiHeadAttention(D, H, fused=True)
    layer.keep_weights = True
    _, returned = layer(src, src, src, key_padding_mask=src_padding)
    assert returned is None
    assert layer.last_weights.shape == (B, H, S, S)
    assert (layer.last_weights[2, :, :, 2:] == 0).all()
    assert not layer.last_weights.requires_grad


@pytest.mark.parametrize("fused", [False, True])
def test_self_attention_cache_equals_full_causal(inputs, fused):
    _, tgt, _ = inputs
    torch.manual_seed(1)
    layer = MultiHeadAttention(D, H, fused=fused).eval()
    tgt_padding = torch.zeros(B, T, dtype=torch.bool)
    tgt_padding[1, 0] = True                                                 # a left-padded sequence
    with torch.no_grad():
        full, _ = layer(tgt, tgt, tgt, attn_mask=subsequent_mask(T), key_padding_mask=tgt_padding)
        cache, steps = {}, []
        for t in range(T):
            step, _ = layer(tgt[:, t:t + 1], tgt[:, t:t + 1], tgt[:, t:t + 1],
                            key_padding_mask=tgt_padding[:, :t + 1], cache=cache)
            steps.append(step)
            assert cache["k"].shape == (B, H, t + 1, D // H)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


def test_static_kv_cache_projects_memory_once(inputs):
    src, tgt, src_padding = inputs
    layer = MultiHeadAttention(D, H).eval()
    calls = []
    layer.k_proj.register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        full, _ = layer(tgt, src, src, key_padding_mask=src_padding)
        calls.clear()
        cache, steps = {}, []
        for t in range(T):
            steps.append(layer(tgt[:, t:t + 1], src, src, key_padding_mask=src_padding,
                               cache=cache, static_kv=True)[0])
    assert len(calls) == 1
    assert cache["k"].shape == (B, H, S, D // H)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("d_model, n_heads", [(30, 4), (16, 3)])
def test_indivisible_d_model_names_both_numbers(d_model, n_heads):
    with pytest.raises(ValueError, match=f"d_model={d_model} is not divisible by n_heads={n_heads}"):
        MultiHeadAttention(d_model, n_heads)


@pytest.mark.parametrize("d_model, n_heads", [(0, 1), (16, 0), (16.0, 4), (True, 1)])
def test_non_positive_sizes(d_model, n_heads):
    with pytest.raises(ValueError, match="must be a positive int"):
        MultiHeadAttention(d_model, n_heads)


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5, "0.1"])
def test_bad_dropout(dropout):
    with pytest.raises(ValueError, match=r"dropout must be a float in \[0, 1\)"):
        MultiHeadAttention(D, H, dropout=dropout)


def _bad_calls(src, tgt, src_padding):
    return {
        "query last dim": (lambda m: m(tgt[..., :8], src, src), ValueError, r"query must have shape \(B, L, d_model=16\)"),
        "2-D key": (lambda m: m(tgt, src[0], src), ValueError, r"key must have shape \(B, L, d_model=16\)"),
        "batch sizes": (lambda m: m(tgt[:2], src, src), ValueError, "same batch size B, got 2, 3 and 3"),
        "key/value lengths": (lambda m: m(tgt, src, src[:, :4]), ValueError, "same length Lk, got 7 and 4"),
        "attn_mask shape": (lambda m: m(tgt, src, src, attn_mask=subsequent_mask(T)), ValueError,
                            r"attn_mask must have shape \(Lq, Lk\)=\(5, 7\)"),
        "padding shape": (lambda m: m(tgt, src, src, key_padding_mask=src_padding[:, :5]), ValueError,
                          r"key_padding_mask must have shape \(B, Lk\)=\(3, 7\)"),
        "float attn_mask": (lambda m: m(tgt, src, src, attn_mask=torch.zeros(T, S)), TypeError,
                            "attn_mask must be a bool tensor with True = blocked"),
        "float padding": (lambda m: m(tgt, src, src, key_padding_mask=src_padding.float()), TypeError,
                          "key_padding_mask must be a bool tensor"),
        "not a tensor": (lambda m: m(tgt.tolist(), src, src), TypeError, "query must be a torch.Tensor"),
    }


@pytest.mark.parametrize("case", list(_bad_calls(None, None, None)))
def test_bad_inputs_raise_before_any_matmul(inputs, case):
    call, error, message = _bad_calls(*inputs)[case]
    layer = MultiHeadAttention(D, H)
    with count_linear_calls() as calls, pytest.raises(error, match=message):
        call(layer)
    assert calls == []


def test_cache_from_another_batch_is_rejected(inputs):
    src, tgt, _ = inputs
    layer = MultiHeadAttention(D, H)
    cache = {}
    layer(tgt[:, :1], tgt[:, :1], tgt[:, :1], cache=cache)
    with pytest.raises(ValueError, match="cache holds keys for batch size 3"):
        layer(tgt[:2, :1], tgt[:2, :1], tgt[:2, :1], cache=cache)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("fused", [False, True])
def test_cuda_equals_nn_multihead_attention(pair, inputs, kind, fused):
    reference, layers = pair
    reference, layer = reference.cuda(), layers[fused].cuda()
    query, memory, attn_mask, key_padding_mask = (t.cuda() for t in _case(kind, "attn+padding", inputs))
    with torch.no_grad():
        expected, _ = reference(query, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask)
        out, _ = layer(query, memory, memory, attn_mask, key_padding_mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype, model_fix", [(torch.float64, ".double()"), (torch.float16, ".half()"),
                                              (torch.bfloat16, ".bfloat16()")])
@pytest.mark.parametrize("wrong", ["query", "key", "value"])
def test_input_dtype_other_than_weights_names_both(inputs, dtype, model_fix, wrong):
    src, tgt, _ = inputs
    args = {"query": tgt, "key": src, "value": src}
    args[wrong] = args[wrong].to(dtype)
    layer = MultiHeadAttention(D, H)
    message = (rf"{wrong} has dtype {dtype} but the layer's weights are torch.float32; "
               rf"convert with \.to\(torch.float32\) or the model with \{model_fix[:-2]}\(\)")
    with count_linear_calls() as calls, pytest.raises(TypeError, match=message):
        layer(args["query"], args["key"], args["value"])
    assert calls == []


def test_double_layer_accepts_double_inputs(inputs):
    src, tgt, src_padding = inputs
    layer = MultiHeadAttention(D, H).double()
    out, _ = layer(tgt.double(), src.double(), src.double(), key_padding_mask=src_padding)
    assert out.dtype == torch.float64


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("fused", [False, True])
def test_autocast_inputs_of_the_autocast_dtype_are_accepted(inputs, device, fused):
    """Under torch.autocast, bfloat16 activations meet float32 weights by design: no dtype error."""
    src, tgt, src_padding = (t.to(device) for t in inputs)
    layer = MultiHeadAttention(D, H, fused=fused).to(device).eval()
    with torch.no_grad():
        expected, _ = layer(tgt, src, src, key_padding_mask=src_padding)
        with torch.autocast(device, dtype=torch.bfloat16):
            out, _ = layer(tgt.bfloat16(), src.bfloat16(), src.bfloat16(), key_padding_mask=src_padding)
    assert layer.q_proj.weight.dtype == torch.float32 and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=0.1, rtol=0.1)  # bfloat16 keeps ~3 digits


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_input_checks_add_no_host_sync(inputs):
    """The dtype check compares metadata only: a forward pass never waits for the GPU."""
    src, tgt, _ = (t.cuda() for t in inputs)
    layer = MultiHeadAttention(D, H).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(tgt, src, src)
    finally:
        torch.cuda.set_sync_debug_mode("default")
