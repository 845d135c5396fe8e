"""The checkers of notebook 06's exercises: plausible slips -> a message
that names them, right answers (several ways of writing them) -> "correct"; the RMSNorm checker also works without nn.RMSNorm.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import pytest
import torch
from torch import nn

from transformer_lib.exercises import sublayers as checkers
from transformer_lib.exercises.sublayers import check_pre_ln_residual, check_rms_norm


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



def rms_norm_right(x, weight, eps=1e-6):
    return weight * x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def rms_norm_rsqrt_float64(x, weight, eps=1e-6):
    x64 = x.double()
    return (x64 * torch.rsqrt((x64 * x64).sum(-1, keepdim=True) / x.size(-1) + eps) * weight.double()).float()


def rms_norm_in_place_on_a_copy(x, weight, eps=1e-6):
    out = x.clone()
    out.div_(x.norm(dim=-1, keepdim=True).div(x.size(-1) ** 0.5).pow(2).add(eps).sqrt()).mul_(weight)
    return out


def pre_ln_right(x, sublayer, norm):
    return x + sublayer(norm(x))


def pre_ln_separate_steps(x, sublayer, norm):
    h = norm(x)
    h = sublayer(h)
    return h.add(x)


@pytest.mark.parametrize("check, right", [(check_rms_norm, rms_norm_right), (check_rms_norm, rms_norm_rsqrt_float64),
                                          (check_rms_norm, rms_norm_in_place_on_a_copy),
                                          (check_pre_ln_residual, pre_ln_right),
                                          (check_pre_ln_residual, pre_ln_separate_steps)])
def test_right_answers_pass(check, right):
    assert accepted(check, right)


def test_rms_norm_checker_falls_back_to_the_formula_without_nn_rmsnorm(monkeypatch, capsys):
    monkeypatch.delattr(nn, "RMSNorm", raising=False)
    assert checkers.check_rms_norm(rms_norm_right) is None
    out = capsys.readouterr().out
    assert "has no nn.RMSNorm (it came in torch 2.4): checking against the formula" in out
    assert out.splitlines()[-1] == "correct: RMSNorm"


def in_place(x, w, eps):
    x /= torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * w


@pytest.mark.parametrize("wrong, message", [
    (lambda x, w, eps: w * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps),
     "subtracted the mean"),
    (lambda x, w, eps: w * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps), "inside the square root"),
    (lambda x, w, eps: w * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps), "sum of the squares"),
    (lambda x, w, eps: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps), "gain is missing"),
    (lambda x, w, eps: w * x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps), "LAST dimension"),
    (lambda x, w, eps: w * x / torch.sqrt(x.pow(2).mean(1, keepdim=True) + eps), "LAST dimension"),
    (lambda x, w, eps: w * x / x.std(-1, keepdim=True), "standard deviation"),
    (lambda x, w, eps: w * x / (x.std(-1, keepdim=True) + eps), "standard deviation"),
    (lambda x, w, eps: w * x / torch.sqrt(x.var(-1, keepdim=True) + eps), "standard deviation"),
    (lambda x, w, eps: w * x / x.pow(2).mean(-1, keepdim=True).sqrt(), "eps is missing"),
    (lambda x, w, eps: w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) * eps), "added, not multiplied"),
    (lambda x, w, eps: w * x / (x.pow(2).mean(-1, keepdim=True) + eps), "without the square root"),
    (lambda x, w, eps: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) / w, "gain divides"),
    (lambda x, w, eps: w * x / torch.sqrt(x.pow(2).mean(-1) + eps), "raised RuntimeError .* keepdim=True"),
    (in_place, "changed its input `x` in place"),
    (lambda x, w, eps: 1.01 * rms_norm_right(x, w, eps), "1.01 times the right one"),
])
def test_rms_norm_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_rms_norm(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, sublayer, norm: norm(x + sublayer(x)), "that is post-LN"),
    (lambda x, sublayer, norm: sublayer(norm(x)), "residual is missing"),
    (lambda x, sublayer, norm: x + norm(sublayer(x)), "sublayer's input, not its output"),
    (lambda x, sublayer, norm: x + sublayer(x), "LayerNorm is missing"),
    (lambda x, sublayer, norm: norm(x) + sublayer(norm(x)), "adds the NORMALISED x"),
    (lambda x, sublayer, norm: norm(x + sublayer(norm(x))), "LayerNorm on the output too"),
    (lambda x, sublayer, norm: x + 2 * sublayer(norm(x)), "differs from SublayerConnection"),
])
def test_pre_ln_residual_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pre_ln_residual(wrong)


def rms_norm_module(x, weight, eps=1e-6):
    layer = torch.nn.RMSNorm(x.size(-1), eps=eps)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer(x)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, w, eps: w * x / torch.sqrt(x.pow(2).mean() + eps), "ran over ALL the elements"),
    (lambda x, w, eps: w * x / torch.sqrt(torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)), "square root twice"),
    (lambda x, w, eps: torch.nn.functional.rms_norm(x, (x.size(-1),), w, eps), "F.rms_norm .* is PyTorch's RMSNorm"),
    (rms_norm_module, "F.rms_norm \\(or nn.RMSNorm\\)"),
    (lambda x, w, eps: w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), "eps must go inside|eps is missing|differs"),
    (lambda x, w, eps: (w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)).reshape(-1, x.size(-1)),
     "returned shape"),
])
def test_rms_norm_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_rms_norm(wrong)


def pre_ln_block(x, sublayer, norm):
    from transformer_lib.sublayers import SublayerConnection
    block = SublayerConnection(x.size(-1), dropout=0.0, norm_first=True)
    block.norm = norm
    return block(x, sublayer)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, sublayer, norm: x + sublayer(norm(norm(x))), "LayerNorm was applied twice"),
    (pre_ln_block, "SublayerConnection is the course's own residual connection"),
    (lambda x, sublayer, norm: x.add_(sublayer(norm(x))), "changed its input `x` in place"),
])
def test_pre_ln_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pre_ln_residual(wrong)


def test_pre_ln_runs_with_autograd():
    def needs_grad(x, sublayer, norm):
        assert torch.is_grad_enabled()
        return x + sublayer(norm(x))

    assert accepted(check_pre_ln_residual, needs_grad)


# ---------------------------------------------------------------- fresh4: dropout left on
@pytest.mark.parametrize("wrong", [
    lambda x, sublayer, norm: x + torch.nn.functional.dropout(sublayer(norm(x)), p=0.1),
    lambda x, sublayer, norm: torch.nn.functional.dropout(x + sublayer(norm(x)), p=0.2),
])
def test_pre_ln_residual_with_dropout_left_on_is_named(wrong):
    with pytest.raises(AssertionError, match=r"that is dropout in training mode .* has no dropout"):
        check_pre_ln_residual(wrong)
