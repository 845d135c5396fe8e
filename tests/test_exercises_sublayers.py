"""The checkers of notebook 06's exercises: plausible slips -> a message
that names them, a right answer -> True; the RMSNorm checker also works without nn.RMSNorm.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import pytest
import torch
from torch import nn

from transformer_lib.exercises import sublayers as checkers
from transformer_lib.exercises.sublayers import check_pre_ln_residual, check_rms_norm


def rms_norm_right(x, weight, eps=1e-6):
    return weight * x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def pre_ln_right(x, sublayer, norm):
    return x + sublayer(norm(x))


@pytest.mark.parametrize("check, right", [(check_rms_norm, rms_norm_right), (check_pre_ln_residual, pre_ln_right)])
def test_right_answer_passes(check, right, capsys):
    assert check(right) is True
    # The last line: on torch < 2.4 the RMSNorm checker first says which reference it uses.
    assert capsys.readouterr().out.splitlines()[-1].startswith("correct: ")


def test_rms_norm_checker_falls_back_to_the_formula_without_nn_rmsnorm(monkeypatch, capsys):
    monkeypatch.delattr(nn, "RMSNorm", raising=False)
    assert checkers.check_rms_norm(rms_norm_right) is True
    assert "has no nn.RMSNorm (it came in torch 2.4): checking against the formula" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [
    (lambda x, w, eps: w * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps),
     "subtracted the mean"),
    (lambda x, w, eps: w * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps), "inside the square root"),
    (lambda x, w, eps: w * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps), "sum of the squares"),
    (lambda x, w, eps: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps), "gain is missing"),
    (lambda x, w, eps: w * x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps), "differs from nn.RMSNorm"),
])
def test_rms_norm_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_rms_norm(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, sublayer, norm: norm(x + sublayer(x)), "that is post-LN"),
    (lambda x, sublayer, norm: sublayer(norm(x)), "residual is missing"),
    (lambda x, sublayer, norm: x + norm(sublayer(x)), "sublayer's input, not its output"),
    (lambda x, sublayer, norm: x + sublayer(x), "LayerNorm is missing"),
    (lambda x, sublayer, norm: x + 2 * sublayer(norm(x)), "differs from SublayerConnection"),
])
def test_pre_ln_residual_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pre_ln_residual(wrong)
