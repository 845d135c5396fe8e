"""Checkers for the exercises of notebook 06 (feed-forward, residual connections, LayerNorm).

Hand-written, not exported (see `transformer_lib.exercises`): `check_rms_norm` compares with PyTorch's
`nn.RMSNorm` (torch >= 2.4; on an older torch with the formula, and says so), `check_pre_ln_residual`
with the course's `SublayerConnection(norm_first=True)`; both name the likely slip of a wrong answer.
"""
import torch
from torch import Tensor, nn

from transformer_lib.exercises import run_checker
from transformer_lib.sublayers import LayerNorm, PositionwiseFeedForward, SublayerConnection


def _fill_(module: nn.Module, generator: torch.Generator, scale: float = 0.5) -> nn.Module:
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
    return module


def _rms_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    if hasattr(nn, "RMSNorm"):
        reference = nn.RMSNorm(x.size(-1), eps=eps)
        with torch.no_grad():
            reference.weight.copy_(weight)
            return reference(x)
    return weight * x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def _check_rms_norm(rms_norm) -> None:
    if not hasattr(nn, "RMSNorm"):
        print(f"torch {torch.__version__} has no nn.RMSNorm (it came in torch 2.4): checking against the formula")
    generator = torch.Generator().manual_seed(6)
    x = 1.0 + 3.0 * torch.randn(3, 4, 8, generator=generator)            # (B, L, D), mean far from 0
    weight = torch.randn(8, generator=generator)                          # γ (D,)
    for eps in (1e-6, 0.5):                                               # a large ε shows where it goes
        expected = _rms_reference(x, weight, eps)
        result = rms_norm(x.clone(), weight.clone(), eps)
        assert isinstance(result, Tensor), f"rms_norm must return a torch.Tensor, got {type(result).__name__}"
        assert result.shape == expected.shape, f"rms_norm returned shape {tuple(result.shape)}, expected {tuple(x.shape)}"
        ms = x.pow(2).mean(dim=-1, keepdim=True)                          # (B, L, 1): mean of the squares
        centred = x - x.mean(dim=-1, keepdim=True)
        slips = {
            "you subtracted the mean: that is LayerNorm. RMSNorm does not centre x, it only divides by "
            "sqrt(mean(x²) + eps)": weight * centred / torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps),
            "the sum of the squares was used; RMSNorm takes their mean over the last dimension (divide by D)":
                weight * x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps),
            "the gain is missing: multiply by weight (γ, one per feature)": x / torch.sqrt(ms + eps),
        }
        if eps > 0.1:  # with a tiny ε, where it goes makes no visible difference
            slips["eps must go inside the square root: sqrt(mean(x²) + eps), as in nn.RMSNorm"] = \
                weight * x / (ms.sqrt() + eps)
        for message, wrong in slips.items():
            assert not torch.allclose(result, wrong, atol=1e-5, rtol=1e-4), message
        torch.testing.assert_close(result, expected, atol=1e-5, rtol=1e-4, msg=lambda m: (
            f"rms_norm differs from nn.RMSNorm(D, eps={eps}) with the same weight; the mean of x² runs over the "
            f"last dimension, with keepdim=True: {m}"))


def check_rms_norm(your_function) -> bool:
    """Exercise 1 of notebook 06: RMSNorm, against torch.nn.RMSNorm."""
    return run_checker("RMSNorm", your_function, _check_rms_norm)


def _check_pre_ln_residual(pre_ln_residual) -> None:
    generator = torch.Generator().manual_seed(6)
    B, L, D = 2, 5, 16
    norm = _fill_(LayerNorm(D), generator)
    sublayer = _fill_(PositionwiseFeedForward(D, 32, dropout=0.0), generator).eval()
    x = torch.randn(B, L, D, generator=generator)                         # (B, L, D)
    block = SublayerConnection(D, dropout=0.0, norm_first=True).eval()
    block.norm.load_state_dict(norm.state_dict())
    with torch.no_grad():
        expected = block(x, sublayer)
        result = pre_ln_residual(x.clone(), sublayer, norm)
        slips = {
            "that is post-LN, LayerNorm(x + Sublayer(x)); pre-LN normalises the sublayer's input: "
            "x + Sublayer(LayerNorm(x))": norm(x + sublayer(x)),
            "the residual is missing: add x to the sublayer's output": sublayer(norm(x)),
            "the LayerNorm must be applied to the sublayer's input, not its output": x + norm(sublayer(x)),
            "the LayerNorm is missing: x + Sublayer(LayerNorm(x))": x + sublayer(x),
        }
    assert isinstance(result, Tensor), f"pre_ln_residual must return a torch.Tensor, got {type(result).__name__}"
    assert result.shape == expected.shape, f"expected shape (B, L, D) = {tuple(expected.shape)}, got {tuple(result.shape)}"
    for message, wrong in slips.items():
        assert not torch.allclose(result, wrong, atol=1e-5, rtol=1e-4), message
    torch.testing.assert_close(result, expected, atol=1e-5, rtol=1e-4, msg=lambda m: (
        f"pre_ln_residual differs from SublayerConnection(norm_first=True) without dropout: {m}"))


def check_pre_ln_residual(your_function) -> bool:
    """Exercise 2 of notebook 06: x + Sublayer(LayerNorm(x))."""
    return run_checker("pre-LN residual connection", your_function, _check_pre_ln_residual)
