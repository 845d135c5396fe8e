"""Checkers for the exercises of notebook 04 (scaled dot-product attention).

Hand-written, not exported (see `transformer_lib.exercises`): each `check_…(your_function)` runs the
learner's function on small fixed inputs, compares it with the course's `scaled_dot_product_attention`,
and for a wrong answer names the likely slip (no scale, a fully masked row, the mask's meaning, ...).
"""
import math

import torch
from torch import Tensor

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.exercises import MATRIX_PRODUCTS, Refuse, call, fresh_generator, matrix_product, run_checker
from transformer_lib.exercises.explain import name_difference, shape_story, weight_invariants
from transformer_lib.exercises.guards import allclose, assert_close, equal, tensor_isclose

_NO_FUSED = [Refuse("scaled_dot_product_attention", "F.scaled_dot_product_attention is the fused kernel that "
                    "computes the whole of eq. 1; the exercise asks for it with Python loops, one query at a time"),
             Refuse(scaled_dot_product_attention, "scaled_dot_product_attention is the course's own eq. 1; the "
                    "exercise asks for it with Python loops, one query at a time")]
_NO_MATRIX_PRODUCT = [Refuse(name, "your answer is right, but it multiplies whole matrices (Q @ K.T, or weights @ V "
                             "for all queries at once); the exercise asks for loops: for each query, its scores "
                             "with every key, its softmax, its weighted sum of the values", when=matrix_product)
                      for name in MATRIX_PRODUCTS]


def _close(result, expected: Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    return (isinstance(result, Tensor) and result.shape == expected.shape
            and bool(allclose(result.to(expected.dtype), expected, atol=atol, rtol=rtol)))


def _check_tensor(name: str, result, expected: Tensor, axes: tuple[str, ...] = ("B", "Lq", "Lk")) -> None:
    assert isinstance(result, Tensor), f"{name} must return a torch.Tensor, got {type(result).__name__}"
    if result.shape != expected.shape:
        story = shape_story(tuple(result.shape), tuple(expected.shape), axes[-expected.dim():]) \
            if len(axes) >= expected.dim() else None
        raise AssertionError(f"{name}: {story}" if story else
                             f"{name} returned shape {tuple(result.shape)}, expected {tuple(expected.shape)}")


def _reference_masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    weights = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)  # NaN in fully masked rows
    return weights.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)


def _masked_softmax_inputs() -> list[tuple[Tensor, Tensor]]:
    generator = torch.Generator().manual_seed(4)
    scores = 3 * torch.randn(2, 3, 5, generator=generator)              # (B, Lq, Lk)
    mask = torch.rand(2, 3, 5, generator=generator) < 0.4              # (B, Lq, Lk): True = blocked
    mask[0, 1] = True                                                  # a row with every key blocked
    mask[1, 2] = False                                                 # a row with none blocked
    causal = torch.triu(torch.ones(3, 5, dtype=torch.bool), diagonal=1)  # (Lq, Lk), broadcast over B
    large = 300 * torch.randn(2, 4, 6, generator=generator)            # exp(300) overflows: subtract the max
    fresh = fresh_generator()
    B, Lq, Lk = (int(torch.randint(1, high, (), generator=fresh)) for high in (4, 6, 8))
    drawn = torch.randn(B, Lq, Lk, generator=fresh, dtype=torch.float64) * 10
    padding = torch.rand(B, 1, Lk, generator=fresh) < 0.5               # (B, 1, Lk): key padding
    padding[0] = True                                                  # one sentence all padding
    return [(scores, mask), (scores, causal), (scores.double(), mask),     # float64 weights from float64 scores
            (large, torch.rand(2, 4, 6, generator=generator) < 0.3), (drawn, padding)]


def _check_masked_softmax(masked_softmax) -> None:
    for scores, mask in _masked_softmax_inputs():
        result = call(masked_softmax, scores, mask, on=f"scores {tuple(scores.shape)} and a mask "
                      f"{tuple(mask.shape)}" + (" that broadcasts over the batch" if mask.dim() < scores.dim() else "")
                      + (" with large scores" if scores.abs().max() > 100 else ""),
                      hint=lambda e: ("mask is a bool tensor that broadcasts to scores: use masked_fill(mask, ...), "
                                      "and keepdim=True where you reduce" if isinstance(e, RuntimeError) else None))
        expected = _reference_masked_softmax(scores, mask)
        _check_tensor("masked_softmax", result, expected)
        if _close(result, _reference_masked_softmax(scores, ~mask)) and not _close(result, expected):
            raise AssertionError("you kept the entries where mask is True and blocked the others; in the course "
                                 "(and nn.MultiheadAttention) True means 'may NOT attend'")
        blocked = mask.expand_as(scores)
        zeroed_after = scores.softmax(dim=-1).masked_fill(blocked, 0.0)
        if not _close(result, expected):
            as_probabilities = result.detach().double().exp().nan_to_num(nan=0.0)
            if (result.detach().nan_to_num(nan=0.0) <= 1e-6).all() and (result < -1e-6).any() and (
                    _close(as_probabilities, expected) or _close(as_probabilities.masked_fill(blocked, 0.0), expected)):
                raise AssertionError("those are log-probabilities (log_softmax): exp of your answer gives the weights; "
                                     "the weights are probabilities, softmax")
        if _close(result, zeroed_after) and not _close(result, expected):
            raise AssertionError("you zeroed the masked weights AFTER the softmax, so the others no longer sum to 1; "
                                 "fill the masked scores with -inf BEFORE the softmax")
        if not _close(result, expected) and (_close(result, (scores * ~blocked).softmax(dim=-1)) or _close(
                result, (scores * ~blocked).softmax(dim=-1).masked_fill(blocked.all(-1, keepdim=True), 0.0))):
            raise AssertionError("multiplying the scores by the mask sets masked scores to 0, and exp(0) = 1 is not "
                                 "a zero weight; fill them with -inf (scores.masked_fill(mask, float('-inf')))")
        _name_one_max_for_all(result, expected, scores, blocked)
        rows_with_keys = ~blocked.all(dim=-1)                           # (B, Lq)
        if not result[rows_with_keys].isfinite().all():
            bad = ~result.isfinite()
            times_inf = (scores + blocked.to(scores.dtype) * float("-inf")).softmax(dim=-1)   # 0 · (−inf) = NaN
            if equal(bad[rows_with_keys], ~times_inf[rows_with_keys].isfinite()):
                raise AssertionError("NaN in every row that has a masked entry, also at its unmasked entries: "
                                     "mask * -inf gives 0 · (−inf) = NaN where the mask is False. Fill instead: "
                                     "scores.masked_fill(mask, float('-inf'))")
            largest = scores.abs().max().item()
            if largest > 80:
                raise AssertionError(f"NaN or inf in rows that have keys to attend to, for scores up to {largest:.0f}: "
                                     "exp of a large score overflows. Subtract each row's largest score before exp "
                                     "(torch.softmax does it for you)")
            raise AssertionError(f"NaN or inf in rows that have keys to attend to, on scores no larger than "
                                 f"{largest:.1f} (too small to overflow exp): look for a 0 · inf, an inf − inf or a "
                                 "division by a zero sum in your code")
        full_rows = blocked.all(dim=-1)                                 # (B, Lq)
        if full_rows.any():
            assert not result[full_rows].isnan().any(), (
                "a row whose entries are all masked gave NaN (softmax of a row of -inf is 0/0). Find those "
                "rows with mask.all(dim=-1, keepdim=True) and return zeros there")
            uniform = torch.full_like(result[full_rows], 1 / scores.size(-1))
            assert not allclose(result[full_rows], uniform), (
                "a row whose entries are all masked gave uniform weights 1/Lk instead of zeros: with a large "
                "negative fill such as -1e9 every entry of that row is equal. Zero those rows explicitly")
            assert (result[full_rows] == 0).all(), "a row whose entries are all masked must get all-zero weights"
        assert (result[blocked] == 0).all(), "entries where mask is True must get weight exactly 0 (fill with -inf)"
        if _close(result, _reference_masked_softmax(scores.transpose(-2, -1), blocked.transpose(-2, -1)).transpose(
                -2, -1)) and not _close(result, expected):
            raise AssertionError("the softmax ran over the wrong dimension: it must normalise the last one (dim=-1)")
        broken = weight_invariants(result, blocked)
        if broken:
            raise AssertionError(f"masked_softmax on scores {tuple(scores.shape)}: {broken}; the weights are "
                                 "softmax(scores.masked_fill(mask, -inf), dim=-1), and 0 in rows with every key masked")
        name_difference(result, expected, f"masked_softmax on scores {tuple(scores.shape)}: ", "; the weights are "
                        "softmax(scores.masked_fill(mask, -inf), dim=-1), and 0 in rows with every key masked")
        assert_close(result.to(expected.dtype), expected, atol=1e-6, rtol=1e-5, msg=lambda m: (
            "masked_softmax differs from softmax(scores.masked_fill(mask, -inf), dim=-1) on the rows that are not "
            f"fully masked: {m}"))
        assert result.dtype == scores.dtype, (
            f"masked_softmax on {scores.dtype} scores {tuple(scores.shape)}: the right values, but in {result.dtype}; "
            f"the weights keep the scores' dtype (softmax does): no .float() or .to(...) on the way")


def _name_one_max_for_all(result: Tensor, expected: Tensor, scores: Tensor, blocked: Tensor) -> None:
    """Rows far below the tensor's largest score that come out all 0 (or NaN), every other row right: one max was
    subtracted for the whole tensor (or a whole matrix), and exp underflowed in those rows."""
    if not isinstance(result, Tensor) or result.shape != expected.shape:
        return
    got = result.detach().double()
    wrong = ~tensor_isclose(got, expected.double(), atol=1e-5, rtol=1e-4).all(dim=-1)   # (B, Lq)
    open_scores = scores.double().masked_fill(blocked, float("-inf"))
    far = open_scores.amax(dim=-1) < scores.double().max() - 60           # (B, Lq): exp(score − max) ≈ 0 there
    dead = (got.nan_to_num(nan=0.0) == 0).all(dim=-1) & ~blocked.all(dim=-1)
    if wrong.any() and not (wrong & ~far).any() and (wrong & dead).any():
        raise AssertionError(
            f"masked_softmax on scores {tuple(scores.shape)} up to {scores.abs().max().item():.0f}: {int(wrong.sum())} "
            "rows came out all 0 (or NaN), and each of them has its own largest score far below the largest score of "
            "the whole tensor; every other row is right. exp(score − m) underflows to 0 for a whole row when m is "
            "larger than that row's scores by ~100 or more, so m must be each row's OWN largest score: "
            "scores.max(dim=-1, keepdim=True) (torch.softmax does it)")


def check_masked_softmax(your_function) -> None:
    """Exercise 1 of notebook 04: `masked_softmax(scores, mask)`, zeros (not NaN) for fully masked rows."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("masked softmax", your_function, _check_masked_softmax)


def _attention(query: Tensor, key: Tensor, value: Tensor, scale: float, dim: int = -1) -> Tensor:
    return (query @ key.T / scale).softmax(dim=dim) @ value


def _loop_inputs() -> list[tuple[Tensor, Tensor, Tensor]]:
    """Fixed: d_k = 9 (so that d_k, sqrt(d_k), 2 sqrt(d_k), d_v and L_k all differ), then scores up to ~1000
    (exp overflows unless the max is subtracted); then sizes drawn afresh."""
    generator = torch.Generator().manual_seed(4)
    fixed = (2 * torch.randn(3, 9, generator=generator), 2 * torch.randn(5, 9, generator=generator),
             torch.randn(5, 2, generator=generator))                    # (Lq, d_k), (Lk, d_k), (Lk, d_v)
    large = (40 * torch.randn(2, 6, generator=generator), 40 * torch.randn(4, 6, generator=generator),
             torch.randn(4, 3, generator=generator))
    fresh = fresh_generator()
    Lq, Lk, d_k, d_v = (int(torch.randint(1, high, (), generator=fresh)) for high in (5, 7, 12, 6))
    drawn = tuple(torch.randn(n, d, generator=fresh) for n, d in ((Lq, d_k), (Lk, d_k), (Lk, d_v)))
    tiny = (torch.randn(1, 1, generator=generator), torch.randn(1, 1, generator=generator),
            torch.randn(1, 2, generator=generator))                     # one query, one key, d_k = 1
    key = 0.5 + torch.rand(5, 4, generator=generator)                   # positive: q · k grows with q
    query = torch.stack([1000 * torch.ones(4), 0.3 * torch.randn(4, generator=generator), 990 * torch.ones(4)])
    spread = (query, key, torch.randn(5, 3, generator=generator))       # queries' largest scores ~2000 and ~1 apart
    return [fixed, large, tiny, drawn, spread]


def _as_tensor(result, like: Tensor):
    if isinstance(result, (list, tuple)) and not isinstance(result, Tensor):
        try:
            return torch.stack([torch.as_tensor(row, dtype=like.dtype) for row in result])
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError("attention_by_loops must return a (Lq, d_v) tensor (or a nested list of numbers)")
    return result


def _check_attention_by_loops(attention_by_loops) -> None:
    for query, key, value in _loop_inputs():
        _check_loops_on(attention_by_loops, query, key, value)
    query, key, value = _loop_inputs()[0]
    call(attention_by_loops, query, key, value, on="the first query, key and value again", refuse=_NO_MATRIX_PRODUCT)


def _far_apart(query: Tensor, key: Tensor) -> str | None:
    """When some query's largest scaled score lies far below another query's: "query i's largest ... query j's"."""
    largest = (query.double() @ key.double().T / math.sqrt(query.size(-1))).amax(dim=-1)   # (Lq,)
    high, low = int(largest.argmax()), int(largest.argmin())
    if largest[high] - largest[low] < 80:                  # exp(−80) is near float32's smallest number
        return None
    return (f"query {low}'s largest scaled score is {largest[low].item():.1f}, query {high}'s is "
            f"{largest[high].item():.0f}")


def _one_max_hint(query: Tensor, key: Tensor):
    def hint(error: Exception) -> str | None:
        if isinstance(error, OverflowError):
            return "math.exp overflowed: subtract each query's largest score before exp"
        apart = _far_apart(query, key)
        if isinstance(error, ZeroDivisionError) and apart:
            return (f"a division by zero on an input where {apart}: if ONE max is subtracted for all queries (the "
                    "largest score of any query), exp underflows to 0 for every key of a query whose own scores are "
                    "far below it, and that query's sum of exps is 0. Subtract each query's OWN largest score")
        return None
    return hint


def _check_loops_on(attention_by_loops, query: Tensor, key: Tensor, value: Tensor) -> None:
    expected, _ = scaled_dot_product_attention(query, key, value)      # (Lq, d_v)
    (n_queries, d_k), (n_keys, d_v) = query.shape, value.shape
    result = call(attention_by_loops, query, key, value, refuse=_NO_FUSED, hint=_one_max_hint(query, key),
                  on=f"query (Lq={n_queries}, d_k={d_k}), key (Lk={n_keys}, d_k={d_k}), value (Lk={n_keys}, d_v={d_v})")
    result = _as_tensor(result, expected)
    weights = (query @ key.T / math.sqrt(d_k)).softmax(dim=-1)          # (Lq, Lk)
    if isinstance(result, Tensor) and tuple(result.shape) == (n_queries, n_keys) != (n_queries, d_v):
        raise AssertionError("you returned the (Lq, Lk) attention weights; the output is their weighted sum of the "
                             "values: output[i] = sum over j of weight[i, j] * value[j], shape (Lq, d_v)")
    if isinstance(result, Tensor) and _close(result, weights @ key):
        raise AssertionError("you summed the KEYS with the attention weights; the output is the weighted sum of the "
                             "VALUES: output[i] = sum over j of weight[i, j] * value[j], shape (Lq, d_v)")
    _check_tensor("attention_by_loops", result, expected, ("Lq", "d_v"))
    apart = _far_apart(query, key)
    if apart and not _close(result, expected):
        scaled = query.double() @ key.double().T / math.sqrt(d_k)          # (Lq, Lk)
        far = scaled.amax(dim=-1) < scaled.max() - 80                     # (Lq,): the queries far below the top
        bad = ~(result.detach().to(expected.dtype) - expected).abs().le(1e-5 + 1e-4 * expected.abs()).all(dim=-1)
        if not (bad & ~far).any() and not (result.detach()[bad].nan_to_num(nan=0.0) != 0).any():
            raise AssertionError(f"the output of each query far below the others' scores ({apart}) is 0 or NaN, the "
                                 "others are right: exp(score − m) underflowed to 0 for all its keys, so m was larger "
                                 "than its scores: subtract each query's OWN largest score, not the largest over all "
                                 "queries")
    if not result.isfinite().all():
        raise AssertionError(f"NaN or inf in the output for scores up to {(query @ key.T).abs().max().item() / math.sqrt(d_k):.0f}: "
                             "exp of a large score overflows. Subtract the query's largest score from its scores "
                             "before exp (the softmax does not change)")
    slips = {"the scores were not scaled: divide each q·k by sqrt(d_k)": _attention(query, key, value, 1.0),
             "the scores were divided by d_k; the paper divides by sqrt(d_k)": _attention(query, key, value, d_k),
             "the scores were divided by 2·sqrt(d_k); the paper divides by sqrt(d_k)":
                 _attention(query, key, value, 2 * math.sqrt(d_k)),
             "the scores were multiplied by sqrt(d_k) instead of divided by it": _attention(query, key, value, 1 / math.sqrt(d_k)),
             "the scores were divided by sqrt(d_v), the size of the VALUES; eq. 1 divides by sqrt(d_k), the size of "
             "the queries and keys (query.size(-1))": _attention(query, key, value, math.sqrt(d_v)),
             "the scores were divided by sqrt(L_k), the number of keys; eq. 1 divides by sqrt(d_k), the size of "
             "each query and key (query.size(-1))": _attention(query, key, value, math.sqrt(n_keys)),
             "the softmax ran over the queries; for each query, normalise over the keys":
                 _attention(query, key, value, math.sqrt(d_k), dim=0),
             "the weights were divided by sqrt(d_k) AFTER the softmax; scale the scores before it, so that the "
             "weights still sum to 1": (query @ key.T).softmax(dim=-1) / math.sqrt(d_k) @ value,
             "the weights were not normalised (no softmax, or exp without dividing by the sum of the row)":
                 (query @ key.T / math.sqrt(d_k)).exp() @ value,
             "you divided the scores by their sum without exp; the softmax is exp(score) / sum of exp(scores)":
                 (lambda sc: sc / sc.sum(-1, keepdim=True))(query @ key.T / math.sqrt(d_k)) @ value}
    if n_keys > 1:                   # a loop that leaves out the last (or the first) key
        slips |= {f"the {which} key takes no part: the softmax and the weighted sum run over every key "
                  f"j = 0 .. L_k − 1 (range(len(key)), {hint})": _attention(query, key[part], value[part], math.sqrt(d_k))
                  for which, part, hint in (("last", slice(None, -1), "not range(len(key) − 1)"),
                                            ("first", slice(1, None), "starting at 0"))}
    if n_keys > 1:                   # an index off by one (value[j - 1] wraps around to the last row at j = 0)
        slips |= {f"the values are read one index off: output i is the sum over keys j of weight[i, j] * value[j]; "
                  f"yours used value[j {sign} 1] (check the index of the values in your loop)": weights @ value.roll(shift, 0)
                  for shift, sign in ((1, "-"), (-1, "+"))}
        slips |= {f"the keys are read one index off: weight[i, j] comes from q_i · k_j; yours used key[j {sign} 1] "
                  "(check the index of the keys in your loop)": _attention(query, key.roll(shift, 0), value, math.sqrt(d_k))
                  for shift, sign in ((1, "-"), (-1, "+"))}
    if n_queries > 1 and allclose(result, result[:1].expand_as(result)) and not allclose(
            expected, expected[:1].expand_as(expected)):
        raise AssertionError("every query got the same output row; loop over the queries and give each its own "
                             "scores, softmax and weighted sum")
    for message, wrong in slips.items():
        assert not (_close(result, wrong) and not _close(wrong, expected)), message
    ratios = (result.double() / expected.double())                      # (Lq, d_v): one factor per query?
    if ratios.isfinite().all() and allclose(ratios, ratios[:, :1].expand_as(ratios), rtol=1e-4) and \
            not allclose(ratios, torch.ones_like(ratios), rtol=1e-4):
        raise AssertionError("each output row is the right one times a factor of its own: a query's weights do not "
                             "sum to 1. Divide each exp by the sum of the SAME exps over that query's keys (subtract "
                             "the max from every score, numerator and sum alike)")
    name_difference(result, expected, f"attention_by_loops (d_k={d_k}): ", "; output i is the sum over keys j of "
                    "softmax_j(q_i · k_j / sqrt(d_k)) * value[j]", {"sqrt(d_k)": math.sqrt(d_k), "d_k": d_k})
    assert_close(result.to(expected.dtype), expected, atol=1e-5, rtol=1e-4, msg=lambda m: (
        "attention_by_loops differs from softmax(Q Kᵀ / sqrt(d_k)) V; check that output i is the sum over keys j "
        f"of weight[i, j] * value[j]: {m}"))


def check_attention_by_loops(your_function) -> None:
    """Exercise 2 of notebook 04: eq. 1 with Python loops, one query at a time."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("attention by loops", your_function, _check_attention_by_loops)
