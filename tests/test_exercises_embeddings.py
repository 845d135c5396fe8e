"""The checkers of notebook 02's exercises: plausible slips -> a message that names them, right answers
(several ways of writing them) -> "correct".
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.embeddings import TokenEmbedding
from transformer_lib.exercises.embeddings import check_one_hot_lookup, check_scaled_embedding


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1


def lookup(tokens, weight):
    return F.one_hot(tokens, num_classes=weight.size(0)).to(weight.dtype) @ weight


def lookup_einsum(tokens, weight):
    return torch.einsum("blv,vd->bld", F.one_hot(tokens, weight.size(0)).type_as(weight), weight)


def lookup_by_sum(tokens, weight):
    one_hot = F.one_hot(tokens, weight.size(0)).float()                  # (B, L, V)
    return (one_hot[..., None] * weight).sum(dim=-2)                     # (B, L, V, D) summed over V


def lookup_matmul_2d(tokens, weight):
    flat = F.one_hot(tokens.reshape(-1), weight.size(0)).to(weight.dtype)  # (B·L, V)
    return torch.matmul(flat, weight).reshape(*tokens.shape, -1)


@pytest.mark.parametrize("wrong, message", [
    (lambda tokens, weight: F.one_hot(tokens).float() @ weight, "raised RuntimeError.*num_classes"),
    (lambda tokens, weight: F.one_hot(tokens, weight.size(0)) @ weight, "raised RuntimeError.*dtype"),
    (lambda tokens, weight: weight @ F.one_hot(tokens, weight.size(0)).float(), "raised RuntimeError.*fit together"),
    (lambda tokens, weight: lookup(tokens, weight).detach(), "differentiable"),
    (lambda tokens, weight: lookup(tokens.clamp(max=3), weight), "picks? row t.*|rows are wrong"),
    (lambda tokens, weight: F.one_hot(tokens, weight.size(0)).double() @ weight.double(), "dtype torch.float64"),
    (lambda tokens, weight: weight[tokens], "that is a lookup"),
    (lambda tokens, weight: F.embedding(tokens, weight), "that is a lookup|is the lookup itself"),
])
def test_lookup_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_one_hot_lookup(wrong)


@pytest.mark.parametrize("right", [lookup, lookup_einsum, lookup_by_sum, lookup_matmul_2d])
def test_lookup_right_answers(right):
    assert accepted(check_one_hot_lookup, right)


class Scaled(nn.Module):
    def __init__(self, vocab_size, d_model, std=None, scale=None):
        super().__init__()
        self.lut = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.lut.weight, std=d_model ** -0.5 if std is None else std)
        self.scale = math.sqrt(d_model) if scale is None else scale

    def forward(self, tokens):
        return self.lut(tokens) * self.scale


class ScaledParameter(nn.Module):
    """Another right answer: a bare nn.Parameter, indexed, and the scale computed in forward."""

    def __init__(self, vocab_size, d_model):
        super().__init__()
        self.table = nn.Parameter(torch.randn(vocab_size, d_model) / math.sqrt(d_model))

    def forward(self, tokens):
        return self.table[tokens] * self.table.size(1) ** 0.5


class ScaledBrokenForward(Scaled):
    def forward(self, tokens):
        return self.lut(tokens.float()) * self.scale


@pytest.mark.parametrize("wrong, message", [
    (lambda v, d: Scaled(v, d, scale=1.0), "raw table row: multiply it by sqrt"),
    (lambda v, d: Scaled(v, d, scale=d), "multiplied by d_model"),
    (lambda v, d: Scaled(v, d, scale=d ** -0.5), "divided by sqrt\\(d_model\\)"),
    (lambda v, d: Scaled(v, d, std=1.0), "N\\(0, 1/d_model\\)"),
    (lambda v, d: Scaled(v, d, std=1 / d), "VARIANCE 1/d_model"),
    (ScaledBrokenForward, "raised RuntimeError .* when embedding token ids"),
])
def test_scaled_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_scaled_embedding(wrong)


class ScaledFunctional(nn.Module):
    """Another right answer: a weight of its own, F.embedding, the scale as a buffer."""

    def __init__(self, vocab_size, d_model):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model).normal_(0.0, 1.0 / math.sqrt(d_model)))
        self.register_buffer("scale", torch.tensor(float(d_model)).sqrt())

    def forward(self, tokens):
        return F.embedding(tokens, self.weight) * self.scale


@pytest.mark.parametrize("right", [Scaled, ScaledParameter, ScaledFunctional])
def test_scaled_right_answers(right):
    assert accepted(check_scaled_embedding, right)


@pytest.mark.parametrize("wrong, message", [
    (lambda v, d: Scaled(v, d, scale=16.0), r"times 16; for d_model=100 the scale is sqrt\(d_model\) = 10"),
    (lambda v, d: Scaled(v, d, std=1 / 16), r"std 0.062|N\(0, 1/d_model\)"),
    (TokenEmbedding, "that is the course's TokenEmbedding"),
])
def test_scaled_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_scaled_embedding(wrong)


def lookup_in_place(tokens, weight):
    tokens.clamp_(max=weight.size(0) - 1)                                # harmless here, but it edits the input
    return lookup(tokens, weight)


@pytest.mark.parametrize("wrong, message", [
    (lambda tokens, weight: F.one_hot(tokens, weight.size(0)).float() @ weight, "RuntimeError.*weight's dtype"),
    (lambda tokens, weight: lookup(tokens, weight.index_fill_(0, torch.tensor([0]), 0.0)),
     "changed its input `weight` in place"),
    (lambda tokens, weight: nn.functional.embedding(tokens, weight), "F.embedding .* is the lookup itself"),
    (lambda tokens, weight: torch.tensor([[[0., 1, 2], [12, 13, 14], [12, 13, 14], [3, 4, 5]],
                                          [[6, 7, 8], [9, 10, 11], [0, 1, 2], [0, 1, 2]]]), "expected shape|pick row"),
])
def test_lookup_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_one_hot_lookup(wrong)


# ---------------------------------------------------------------- fresh4: float32 on the way, num_classes = D
def lookup_in_float32(tokens, weight):
    """Right to float32's 7 digits: computed in float32, converted back to the weight's dtype."""
    return (F.one_hot(tokens, weight.size(0)).float() @ weight.float()).to(weight.dtype)


def one_hot_of_width_d(tokens, weight):
    return F.one_hot(tokens, num_classes=weight.size(1)).to(weight.dtype) @ weight


@pytest.mark.parametrize("wrong, message", [
    (lookup_in_float32, "float64 weight .* rounded to float32"),
    (one_hot_of_width_d, "num_classes is the vocabulary size V = weight.size\\(0\\)"),
])
def test_one_hot_lookup_precision_and_width_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_one_hot_lookup(wrong)


def test_one_hot_lookup_in_float64_einsum_is_exact_and_passes():
    assert accepted(check_one_hot_lookup, lambda tokens, weight: torch.einsum(
        "blv,vd->bld", F.one_hot(tokens, weight.size(0)).to(weight.dtype), weight))
