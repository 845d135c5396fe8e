"""The checkers of notebook 04's exercises: plausible slips -> a message
that names them, a right answer -> True.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import math

import pytest
import torch

from transformer_lib.exercises.attention import check_attention_by_loops, check_masked_softmax


def masked_softmax_right(scores, mask):
    weights = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
    return weights.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)


def masked_softmax_nan(scores, mask):
    return scores.masked_fill(mask, float("-inf")).softmax(dim=-1)


def masked_softmax_large_negative(scores, mask):
    return scores.masked_fill(mask, -1e9).softmax(dim=-1)


def masked_softmax_inverted(scores, mask):
    return masked_softmax_right(scores, ~mask)


def masked_softmax_wrong_dim(scores, mask):
    weights = scores.masked_fill(mask, float("-inf")).softmax(dim=-2)
    return torch.nan_to_num(weights, nan=0.0)


def attention_by_loops_right(query, key, value):
    rows = []
    for q in query:
        scores = torch.stack([(q * k).sum() / math.sqrt(q.numel()) for k in key])
        weights = scores.exp() / scores.exp().sum()
        rows.append(sum(w * v for w, v in zip(weights, value)))
    return torch.stack(rows)


def attention_by_loops_unscaled(query, key, value):
    return (query @ key.T).softmax(dim=-1) @ value


def attention_by_loops_over_d_k(query, key, value):
    return (query @ key.T / query.size(-1)).softmax(dim=-1) @ value


def attention_by_loops_wrong_axis(query, key, value):
    return (query @ key.T / math.sqrt(query.size(-1))).softmax(dim=0) @ value


@pytest.mark.parametrize("check, right", [(check_masked_softmax, masked_softmax_right),
                                          (check_attention_by_loops, attention_by_loops_right)])
def test_right_answer_passes(check, right, capsys):
    assert check(right) is True
    assert capsys.readouterr().out.startswith("correct: ")


@pytest.mark.parametrize("wrong, message", [
    (masked_softmax_nan, "all masked gave NaN"),
    (masked_softmax_large_negative, "uniform weights 1/Lk instead of zeros"),
    (masked_softmax_inverted, "True means 'may NOT attend'"),
    (masked_softmax_wrong_dim, "wrong dimension"),
    (lambda scores, mask: scores.softmax(dim=-1), "all masked|weight exactly 0"),
])
def test_masked_softmax_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_masked_softmax(wrong)


@pytest.mark.parametrize("wrong, message", [
    (attention_by_loops_unscaled, "not scaled"),
    (attention_by_loops_over_d_k, "divided by d_k"),
    (attention_by_loops_wrong_axis, "over the queries"),
    (lambda q, k, v: (q @ k.T).softmax(dim=-1), "shape"),
])
def test_attention_by_loops_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_attention_by_loops(wrong)


def test_checker_wants_the_function_itself():
    with pytest.raises(TypeError, match="pass your function itself"):
        check_masked_softmax(masked_softmax_right(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool)))
