"""Tests for transformer_lib.embeddings (notebook 02): TokenEmbedding."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.embeddings import TokenEmbedding

CONFIGS = [(10, 4, None), (10, 4, 0), (37, 16, 3)]  # (vocab_size, d_model, padding_idx)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def tokens():
    torch.manual_seed(0)
    return torch.randint(0, 10, (3, 7))  # (B, L)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab_size, d_model, padding_idx", CONFIGS)
def test_equals_scaled_nn_embedding(vocab_size, d_model, padding_idx, device):
    torch.manual_seed(0)
    embed = TokenEmbedding(vocab_size, d_model, padding_idx).to(device)
    reference = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx).to(device)
    with torch.no_grad():
        reference.weight.copy_(embed.embedding.weight)
    tokens = torch.randint(0, vocab_size, (2, 9), device=device)
    out = embed(tokens)
    assert out.shape == (2, 9, d_model)
    torch.testing.assert_close(out, reference(tokens) * math.sqrt(d_model))


def test_one_hot_times_weight(tokens):
    embed = TokenEmbedding(10, 4)
    one_hot = F.one_hot(tokens, num_classes=10).float()                 # (B, L, V)
    expected = one_hot @ embed.embedding.weight * math.sqrt(4)          # (B, L, D)
    torch.testing.assert_close(embed(tokens), expected)


def test_int32_and_any_shape():
    embed = TokenEmbedding(10, 4)
    ids = torch.tensor([[[1, 2], [3, 4]]], dtype=torch.int32)           # (1, 2, 2)
    torch.testing.assert_close(embed(ids), embed(ids.long()))
    assert embed(ids).shape == (1, 2, 2, 4)
    assert embed(torch.zeros(0, 5, dtype=torch.long)).shape == (0, 5, 4)


def test_init_scale():
    torch.manual_seed(0)
    d_model = 256
    embed = TokenEmbedding(2000, d_model)
    weight_std = embed.embedding.weight.std().item()
    assert abs(weight_std - d_model ** -0.5) < 0.02 * d_model ** -0.5
    out = embed(torch.arange(2000).unsqueeze(0))                        # (1, V, D)
    assert abs(out.std().item() - 1.0) < 0.02                           # unit variance after the scale


def test_gradient_only_to_used_rows():
    embed = TokenEmbedding(10, 4)
    tokens = torch.tensor([[1, 5, 5, 8]])
    embed(tokens).sum().backward()
    grad = embed.embedding.weight.grad
    used = {1, 5, 8}
    for row in range(10):
        assert (grad[row].abs().sum() > 0) == (row in used), f"row {row}"
    # each occurrence contributes sqrt(d_model) per entry; token 5 occurs twice
    torch.testing.assert_close(grad[5], torch.full((4,), 2 * math.sqrt(4)))


def test_padding_row_zero_and_frozen():
    embed = TokenEmbedding(10, 4, padding_idx=2)
    assert torch.equal(embed.embedding.weight[2], torch.zeros(4))
    tokens = torch.tensor([[2, 3, 2, 7]])
    out = embed(tokens)
    assert torch.equal(out[0, 0], torch.zeros(4)) and torch.equal(out[0, 2], torch.zeros(4))
    out.pow(2).sum().backward()
    grad = embed.embedding.weight.grad
    assert torch.equal(grad[2], torch.zeros(4))
    assert grad[3].abs().sum() > 0 and grad[7].abs().sum() > 0


def test_reset_parameters_keeps_padding_zero():
    embed = TokenEmbedding(10, 4, padding_idx=0)
    with torch.no_grad():
        embed.embedding.weight.fill_(1.0)
    embed.reset_parameters()
    assert torch.equal(embed.embedding.weight[0], torch.zeros(4))
    assert embed.embedding.weight[1:].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool, torch.uint8])
def test_non_integer_tokens_raise_type_error(dtype):
    embed = TokenEmbedding(10, 4)
    with pytest.raises(TypeError, match=str(dtype)):
        embed(torch.zeros(2, 3, dtype=dtype))


def test_non_tensor_tokens_raise_type_error():
    with pytest.raises(TypeError, match="torch.Tensor"):
        TokenEmbedding(10, 4)([[1, 2, 3]])


@pytest.mark.parametrize("ids, match", [([[1, 10, 3]], r"max id 10"), ([[-1, 2]], r"min id -1"),
                                        ([[0, 250]], r"max id 250")])
def test_out_of_range_ids_raise_value_error(ids, match):
    embed = TokenEmbedding(10, 4)
    with pytest.raises(ValueError, match=match) as info:
        embed(torch.tensor(ids))
    assert "vocab_size=10" in str(info.value)


@pytest.mark.parametrize("vocab_size, d_model, padding_idx, match", [
    (0, 4, None, "vocab_size"), (-3, 4, None, "vocab_size"), (10.0, 4, None, "vocab_size"),
    (True, 4, None, "vocab_size"), (10, 0, None, "d_model"), (10, 2.5, None, "d_model"),
    (10, 4, 10, "padding_idx"), (10, 4, -1, "padding_idx"), (10, 4, 1.0, "padding_idx"),
])
def test_bad_constructor_args_raise_value_error(vocab_size, d_model, padding_idx, match):
    with pytest.raises(ValueError, match=match):
        TokenEmbedding(vocab_size, d_model, padding_idx)
