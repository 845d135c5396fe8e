"""Feed-forward, LayerNorm and the sublayer connection (notebook 06) against PyTorch and the formulas."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.sublayers import LayerNorm, PositionwiseFeedForward, SublayerConnection

D = 16


@pytest.fixture
def x():
    return 2.0 + 3.0 * torch.randn(3, 5, D, generator=torch.Generator().manual_seed(0))  # (B, L, D)


@pytest.mark.parametrize("shape", [(D,), (7, D), (3, 5, D), (2, 3, 4, D)])
@pytest.mark.parametrize("eps", [1e-5, 1e-6, 1e-2])
def test_layer_norm_equals_nn_layer_norm(shape, eps):
    generator = torch.Generator().manual_seed(1)
    ours, reference = LayerNorm(D, eps), nn.LayerNorm(D, eps)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(D, generator=generator))
        ours.bias.copy_(torch.randn(D, generator=generator))
    reference.load_state_dict(ours.state_dict())
    inputs = 1.0 + 4.0 * torch.randn(shape, generator=generator)
    torch.testing.assert_close(ours(inputs), reference(inputs), atol=1e-5, rtol=1e-5)
    ours(inputs).sum().backward()
    reference(inputs).sum().backward()
    torch.testing.assert_close(ours.weight.grad, reference.weight.grad, atol=1e-4, rtol=1e-5)


def test_layer_norm_of_constant_vector_is_bias():
    norm = LayerNorm(4)
    with torch.no_grad():
        norm.bias.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(norm(torch.full((2, 4), 7.0)), norm.bias.expand(2, 4))


def test_layer_norm_rejects_wrong_width():
    with pytest.raises(ValueError, match=r"last dimension d_model=16, got shape \(3, 1\)"):
        LayerNorm(D)(torch.randn(3, 1))      # would otherwise broadcast silently to (3, 16)


def test_feed_forward_equals_transformer_encoder_layer(x):
    torch.manual_seed(0)
    reference = nn.TransformerEncoderLayer(D, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True).eval()
    ffn = PositionwiseFeedForward(D, 64, dropout=0.0)
    ffn.linear1.load_state_dict(reference.linear1.state_dict())
    ffn.linear2.load_state_dict(reference.linear2.state_dict())
    expected = reference.linear2(reference.activation(reference.linear1(x)))
    torch.testing.assert_close(ffn(x), expected)
    torch.testing.assert_close(ffn(x), F.linear(torch.relu(F.linear(x, ffn.linear1.weight, ffn.linear1.bias)),
                                                ffn.linear2.weight, ffn.linear2.bias))


def test_feed_forward_is_position_wise(x):
    ffn = PositionwiseFeedForward(D, 32, dropout=0.0)
    one_at_a_time = torch.stack([ffn(x[:, i]) for i in range(x.size(1))], dim=1)
    torch.testing.assert_close(ffn(x), one_at_a_time)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("sublayer_kind", ["feed-forward", "linear"])
def test_sublayer_connection_formulas(x, norm_first, sublayer_kind):
    torch.manual_seed(0)
    block = SublayerConnection(D, dropout=0.0, norm_first=norm_first, eps=1e-6)
    with torch.no_grad():
        block.norm.weight.copy_(torch.randn(D))
        block.norm.bias.copy_(torch.randn(D))
    sublayer = PositionwiseFeedForward(D, 32, dropout=0.0) if sublayer_kind == "feed-forward" else nn.Linear(D, D)

    def layer_norm(h):
        mean = h.mean(-1, keepdim=True)
        var = ((h - mean) ** 2).mean(-1, keepdim=True)
        return block.norm.weight * (h - mean) / torch.sqrt(var + 1e-6) + block.norm.bias

    expected = x + sublayer(layer_norm(x)) if norm_first else layer_norm(x + sublayer(x))
    torch.testing.assert_close(block(x, sublayer), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_sublayer_connection_dropout_on_sublayer_output(x, norm_first):
    block = SublayerConnection(D, dropout=0.5, norm_first=norm_first).train()
    torch.manual_seed(3)
    out = block(x, lambda h: torch.ones_like(h))
    torch.manual_seed(3)
    kept = F.dropout(torch.ones_like(x), p=0.5)            # the same dropout mask, scaled by 1/(1-p)
    expected = x + kept if norm_first else block.norm(x + kept)
    torch.testing.assert_close(out, expected)
    block.eval()
    torch.testing.assert_close(block(x, lambda h: torch.ones_like(h)),
                               x + 1 if norm_first else block.norm(x + 1))


@pytest.mark.parametrize("d_model", [0, -4, 16.0, True, None])
def test_bad_d_model(d_model):
    for build in (lambda: LayerNorm(d_model), lambda: PositionwiseFeedForward(d_model, 32),
                  lambda: SublayerConnection(d_model)):
        with pytest.raises(ValueError, match="d_model must be a positive int"):
            build()


@pytest.mark.parametrize("eps", [0, 0.0, -1e-5, "1e-5"])
def test_bad_eps(eps):
    with pytest.raises(ValueError, match="eps must be a positive float"):
        LayerNorm(D, eps)
    with pytest.raises(ValueError, match="eps must be a positive float"):
        SublayerConnection(D, eps=eps)


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 2, "0.1"])
def test_bad_dropout(dropout):
    with pytest.raises(ValueError, match=r"dropout must be a float in \[0, 1\)"):
        PositionwiseFeedForward(D, 32, dropout)
    with pytest.raises(ValueError, match=r"dropout must be a float in \[0, 1\)"):
        SublayerConnection(D, dropout)


@pytest.mark.parametrize("d_ff", [0, -1, 32.0, None])
def test_bad_d_ff(d_ff):
    with pytest.raises(ValueError, match="d_ff must be a positive int"):
        PositionwiseFeedForward(D, d_ff)
