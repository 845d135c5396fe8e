"""The checkers of notebook 04's exercises: plausible slips -> a message
that names them, right answers (several ways of writing them) -> "correct".
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import math

import pytest
import torch

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.exercises.attention import check_attention_by_loops, check_masked_softmax


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



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
        weights = (scores - scores.max()).exp() / (scores - scores.max()).exp().sum()
        rows.append(sum(w * v for w, v in zip(weights, value)))
    return torch.stack(rows)


def attention_by_loops_overflows(query, key, value):
    rows = []
    for q in query:
        scores = torch.stack([(q * k).sum() / math.sqrt(q.numel()) for k in key])
        weights = scores.exp() / scores.exp().sum()                       # exp(400) = inf in float32
        rows.append(sum(w * v for w, v in zip(weights, value)))
    return torch.stack(rows)


def loops(query, key, value, scale=lambda d_k: math.sqrt(d_k), after=1.0, values=True):
    """Loops with a slip chosen by the arguments (the scale, a division after the softmax, keys summed)."""
    rows = []
    for q in query:
        scores = [float((q * k).sum()) / scale(query.size(1)) for k in key]
        exps = [math.exp(s - max(scores)) for s in scores]
        weights = [e / sum(exps) / after for e in exps]
        rows.append(sum(w * x for w, x in zip(weights, value if values else key)))
    return torch.stack(rows)


def attention_by_loops_math_exp(query, key, value):
    """Overflows: math.exp(400) raises OverflowError."""
    rows = []
    for q in query:
        exps = [math.exp(float((q * k).sum()) / math.sqrt(len(q))) for k in key]
        rows.append(sum(e / sum(exps) * v for e, v in zip(exps, value)))
    return torch.stack(rows)


def attention_by_loops_unscaled(query, key, value):
    return (query @ key.T).softmax(dim=-1) @ value


def attention_by_loops_over_d_k(query, key, value):
    return (query @ key.T / query.size(-1)).softmax(dim=-1) @ value


def attention_by_loops_wrong_axis(query, key, value):
    return (query @ key.T / math.sqrt(query.size(-1))).softmax(dim=0) @ value


def masked_softmax_by_hand(scores, mask):
    """Another right answer: exp, zero, normalise, with a guard for empty rows (float64 inside, the scores' dtype
    out)."""
    e = (scores.double() - scores.double().max(dim=-1, keepdim=True).values).exp() * ~mask
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp(min=1e-300), torch.zeros_like(e)).to(scores.dtype)


def masked_softmax_nan_to_num(scores, mask):
    return torch.nan_to_num(scores.masked_fill(mask, float("-inf")).softmax(dim=-1), nan=0.0)


def attention_by_loops_vectorised_rows(query, key, value):
    out = torch.empty(query.size(0), value.size(1))
    for i in range(query.size(0)):
        weights = torch.softmax(key @ query[i] / query.size(1) ** 0.5, dim=0)      # (Lk,)
        out[i] = weights @ value
    return out


def attention_by_loops_lists(query, key, value):
    """Another right answer: Python numbers only, a nested list out."""
    q, k, v = query.tolist(), key.tolist(), value.tolist()
    rows = []
    for qi in q:
        scores = [sum(a * b for a, b in zip(qi, kj)) / math.sqrt(len(qi)) for kj in k]
        exps = [math.exp(s - max(scores)) for s in scores]
        rows.append([sum(e / sum(exps) * vj[c] for e, vj in zip(exps, v)) for c in range(len(v[0]))])
    return rows


@pytest.mark.parametrize("check, right", [(check_masked_softmax, masked_softmax_right),
                                          (check_masked_softmax, masked_softmax_by_hand),
                                          (check_masked_softmax, masked_softmax_nan_to_num),
                                          (check_attention_by_loops, attention_by_loops_right),
                                          (check_attention_by_loops, attention_by_loops_vectorised_rows),
                                          (check_attention_by_loops, attention_by_loops_lists)])
def test_right_answers_pass(check, right):
    assert accepted(check, right)


@pytest.mark.parametrize("wrong, message", [
    (masked_softmax_nan, "all masked gave NaN"),
    (masked_softmax_large_negative, "uniform weights 1/Lk instead of zeros"),
    (masked_softmax_inverted, "True means 'may NOT attend'"),
    (masked_softmax_wrong_dim, "wrong dimension"),
    (lambda scores, mask: scores.softmax(dim=-1), "all masked|weight exactly 0"),
    (lambda scores, mask: scores.softmax(dim=-1).masked_fill(mask, 0.0), "AFTER the softmax"),
    (lambda scores, mask: (scores * ~mask).softmax(dim=-1), "multiplying the scores by the mask"),
    (lambda scores, mask: scores.masked_fill(mask.expand_as(scores).all(-1), 0.0), "raised RuntimeError"),
])
def test_masked_softmax_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_masked_softmax(wrong)


@pytest.mark.parametrize("wrong, message", [
    (attention_by_loops_unscaled, "not scaled"),
    (attention_by_loops_over_d_k, "divided by d_k"),
    (attention_by_loops_wrong_axis, "over the queries"),
    (lambda q, k, v: (q @ k.T).softmax(dim=-1), "attention weights"),
    (lambda q, k, v: (q @ k.T / math.sqrt(v.size(-1))).softmax(dim=-1) @ v, "sqrt\\(d_v\\), the size of the VALUES"),
    (lambda q, k, v: (q @ k.T * math.sqrt(q.size(-1))).softmax(dim=-1) @ v, "multiplied by sqrt"),
    (lambda q, k, v: (q @ k.T / math.sqrt(k.size(0))).softmax(dim=-1) @ v, "number of keys"),
    (lambda q, k, v: (q @ k.T / math.sqrt(q.size(-1))).exp() @ v, "not normalised"),
    (lambda q, k, v: (q @ k / math.sqrt(q.size(-1))).softmax(dim=-1) @ v, "raised RuntimeError"),
])
def test_attention_by_loops_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_attention_by_loops(wrong)


@pytest.mark.parametrize("wrong, message", [
    (attention_by_loops_overflows, "overflows. Subtract"),
    (attention_by_loops_math_exp, "OverflowError.*subtract each query's largest score"),
    (lambda q, k, v: loops(q, k, v, values=False), "summed the KEYS"),
    (lambda q, k, v: loops(q, k, v, scale=lambda d: 1.0, after=math.sqrt(q.size(1))), "AFTER the softmax"),
    (lambda q, k, v: loops(q, k, v, scale=lambda d: 2 * math.sqrt(d)), "divided by 2·sqrt\\(d_k\\)"),
    (lambda q, k, v: loops(q, k, v, scale=lambda d: d), "divided by d_k;"),
    (lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0],
     "the fused kernel"),
    (lambda q, k, v: scaled_dot_product_attention(q, k, v)[0], "the course's own eq. 1"),
    (lambda q, k, v: (q @ k.T / math.sqrt(q.size(-1))).softmax(dim=-1) @ v, "multiplies whole matrices"),
    (lambda q, k, v: torch.einsum("ik,jk->ij", q, k).div(q.size(1) ** 0.5).softmax(-1).mm(v), "multiplies whole"),
    (lambda q, k, v: torch.tensor([[0.0, 0.0]] * 3), "differs from softmax|shape|same output row"),
])
def test_attention_by_loops_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_attention_by_loops(wrong)


def masked_softmax_exp(scores, mask):
    e = scores.exp().masked_fill(mask, 0.0)                               # exp(300) = inf
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def masked_softmax_where(scores, mask):
    """Another right answer: torch.where and a stable exp by hand."""
    filled = torch.where(mask, torch.tensor(float("-inf"), dtype=scores.dtype), scores)
    top = filled.amax(-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).min)
    e = (filled - top).exp()
    return e / e.sum(-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).tiny)


@pytest.mark.parametrize("wrong, message", [
    (masked_softmax_exp, "overflows"),
    (lambda scores, mask: masked_softmax_right(scores, mask.clone().fill_(False)) if mask.dim() == 3 else
     masked_softmax_right(scores, mask), "weight exactly 0|all masked"),
])
def test_masked_softmax_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_masked_softmax(wrong)


def masked_softmax_edits_scores(scores, mask):
    scores.masked_fill_(mask, float("-inf"))
    return torch.nan_to_num(scores.softmax(dim=-1), nan=0.0)


def test_masked_softmax_must_leave_scores_alone():
    with pytest.raises(AssertionError, match="changed its input `scores` in place"):
        check_masked_softmax(masked_softmax_edits_scores)


@pytest.mark.parametrize("check, right", [(check_masked_softmax, masked_softmax_where),
                                          (check_attention_by_loops, loops)])
def test_more_right_answers_pass(check, right):
    assert accepted(check, right)


def test_checker_wants_the_function_itself():
    with pytest.raises(TypeError, match="pass your function itself"):
        check_masked_softmax(masked_softmax_right(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool)))


def test_masked_softmax_log_probabilities_are_named():
    with pytest.raises(AssertionError, match="log-probabilities"):
        check_masked_softmax(lambda s, m: s.masked_fill(m, float("-inf")).log_softmax(-1).nan_to_num(0, neginf=0))


# ---------------------------------------------------------------- fresh4: one max for all, a key left out
def masked_softmax_global_max(scores, mask):
    """One max for the whole tensor: rows far below it underflow to all zeros."""
    e = torch.exp(scores - scores.max()).masked_fill(mask, 0.0)
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def masked_softmax_global_max_nan(scores, mask):
    """The same slip without the guard: 0 / 0 = NaN in the rows that underflowed."""
    e = torch.exp(scores - scores.max()).masked_fill(mask, 0.0)
    weights = e / e.sum(dim=-1, keepdim=True)
    return weights.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)


def loops_global_max(query, key, value, use_torch=False):
    """Subtracts the largest score over ALL queries, not each query's own."""
    scores = [[float((q * k).sum()) / math.sqrt(query.size(1)) for k in key] for q in query]
    top = max(max(row) for row in scores)
    if use_torch:
        exps = torch.tensor(scores).sub(top).exp()                       # float32: 0 / 0 = NaN
        return torch.stack([sum(w * v for w, v in zip(row / row.sum(), value)) for row in exps])
    rows = []
    for row in scores:
        exps = [math.exp(s - top) for s in row]
        rows.append(sum(e / sum(exps) * v for e, v in zip(exps, value)))
    return torch.stack(rows)


def loops_without(which):
    def attention_by_loops(query, key, value):
        keep = slice(None, -1) if which == "last" else slice(1, None)
        return attention_by_loops_right(query, key[keep], value[keep]) if key.size(0) > 1 else \
            attention_by_loops_right(query, key, value)
    return attention_by_loops


@pytest.mark.parametrize("check, wrong, message", [
    (check_masked_softmax, masked_softmax_global_max, "far below the largest score of the whole tensor.*OWN largest"),
    (check_masked_softmax, masked_softmax_global_max_nan, "far below the largest score of the whole tensor.*OWN largest"),
    (check_attention_by_loops, loops_global_max, "ZeroDivisionError.*ONE max is subtracted for all queries"),
    (check_attention_by_loops, lambda q, k, v: loops_global_max(q, k, v, use_torch=True),
     "0 or NaN.*OWN largest score, not the largest over all queries"),
    (check_attention_by_loops, loops_without("last"), "the last key takes no part"),
    (check_attention_by_loops, loops_without("first"), "the first key takes no part"),
])
def test_one_max_for_all_and_a_missing_key_are_named(check, wrong, message):
    with pytest.raises(AssertionError, match=message):
        check(wrong)
