"""The checkers of notebook 02's exercises: plausible slips -> a clear error, right -> True.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import math

import pytest
import torch.nn.functional as F
from torch import nn

from transformer_lib.embeddings import TokenEmbedding
from transformer_lib.exercises.embeddings import check_one_hot_lookup, check_scaled_embedding


def lookup(tokens, weight):
    return F.one_hot(tokens, num_classes=weight.size(0)).to(weight.dtype) @ weight


@pytest.mark.parametrize("wrong, message", [
    (lambda tokens, weight: F.one_hot(tokens).float() @ weight, "num_classes"),
    (lambda tokens, weight: F.one_hot(tokens, weight.size(0)) @ weight, "dtype"),
    (lambda tokens, weight: lookup(tokens, weight).detach(), "differentiable"),
    (lambda tokens, weight: lookup(tokens.clamp(max=3), weight), "pick row t"),
])
def test_lookup_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_one_hot_lookup(wrong)


def test_lookup_right_answer(capsys):
    assert check_one_hot_lookup(lookup) is True
    assert "correct" in capsys.readouterr().out


class Scaled(nn.Module):
    def __init__(self, vocab_size, d_model, std=None, scale=None):
        super().__init__()
        self.lut = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.lut.weight, std=d_model ** -0.5 if std is None else std)
        self.scale = math.sqrt(d_model) if scale is None else scale

    def forward(self, tokens):
        return self.lut(tokens) * self.scale


@pytest.mark.parametrize("wrong, message", [
    (lambda v, d: Scaled(v, d, scale=1.0), "sqrt"),
    (lambda v, d: Scaled(v, d, scale=d), "multiplied by d_model"),
    (lambda v, d: Scaled(v, d, std=1.0), "N\\(0, 1/d_model\\)"),
])
def test_scaled_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_scaled_embedding(wrong)


@pytest.mark.parametrize("right", [Scaled, TokenEmbedding])
def test_scaled_right_answers(right, capsys):
    assert check_scaled_embedding(right) is True
    assert "correct" in capsys.readouterr().out
