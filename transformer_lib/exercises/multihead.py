"""Checkers for the exercises of notebook 05 (multi-head attention).

Hand-written, not exported (see `transformer_lib.exercises`): each `check_…(your_function)` compares
the learner's function with the course's `split_heads` or `MultiHeadAttention` on small fixed inputs,
and for a wrong answer names the likely slip (a view without transpose, no causal mask, ...).
"""
import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib.attention import scaled_dot_product_attention, subsequent_mask
from transformer_lib.exercises import Refuse, call, fresh_generator, run_checker
from transformer_lib.exercises.explain import name_difference, name_slip, shape_story
from transformer_lib.multihead import MultiHeadAttention, merge_heads, split_heads
from transformer_lib.exercises.guards import allclose, assert_close, equal, tensor_isclose

_NO_SPLIT_HEADS = [Refuse(split_heads, "split_heads is the course's own function, the one this exercise asks you to "
                          "write: view x as (B, L, H, d_k), then transpose(1, 2)")]
_NO_FUSED = [Refuse("scaled_dot_product_attention", "F.scaled_dot_product_attention does the attention in one fused "
                    "call; the exercise asks for it by hand: scores, causal mask, softmax, weighted sum"),
             Refuse(scaled_dot_product_attention, "the course's scaled_dot_product_attention does the attention for "
                    "you; the exercise asks for it by hand: scores, causal mask, softmax, weighted sum")]
_BY_HAND = ("the exercise asks for the attention from plain tensor operations (matmul, masked_fill, softmax) on "
            "the layer's four projections; {} does the whole of it")
_NO_LIBRARY_ATTENTION = _NO_FUSED + [
    Refuse(F.multi_head_attention_forward, _BY_HAND.format("F.multi_head_attention_forward")),
    Refuse((nn.MultiheadAttention, "forward"), _BY_HAND.format("nn.MultiheadAttention")),
    Refuse((MultiHeadAttention, "forward"), "causal_self_attention called the layer's forward; use its projections "
           "layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj instead")]


def _check_split_heads(my_split_heads) -> None:
    generator = fresh_generator()
    B, L, H, d_k = (int(torch.randint(low, high, (), generator=generator)) for low, high in ((3, 5), (1, 7), (3, 6), (3, 7)))
    for B, L, D, H in [(2, 3, 8, 4), (1, 5, 6, 2), (3, 1, 9, 3), (1, 1, 4, 2), (B, L, H * d_k, H)]:
        x = torch.arange(B * L * D, dtype=torch.float32).view(B, L, D)  # (B, L, D): every entry different
        expected = split_heads(x, H)                                     # (B, H, L, d_k)
        ones = " and ".join(f"{name} = 1" for name, size in (("B", B), ("L", L)) if size == 1)
        result = call(my_split_heads, x, H, on=f"x of shape (B={B}, L={L}, D={D}) and n_heads={H}",
                      refuse=_NO_SPLIT_HEADS, hint=lambda e: (
                          f"this case has {ones}, an axis of size 1, and the shapes did not fit. If your code squeezes: "
                          "squeeze() drops EVERY axis of size 1, and a size read from the shape after it is another "
                          "axis's; take B, L, D = x.shape once, and squeeze only the axis you mean, if any"
                          if ones and isinstance(e, RuntimeError) else None))
        assert isinstance(result, Tensor), f"my_split_heads must return a torch.Tensor, got {type(result).__name__}"
        d_k = D // H
        story = shape_story(tuple(result.shape), tuple(expected.shape), ("B", "H", "L", "d_k"))
        if story and "is gone" in story:                                 # a squeeze() that lost B = 1 (or L = 1)
            raise AssertionError(f"my_split_heads(x of shape {(B, L, D)}, n_heads={H}): {story}")
        if tuple(result.shape) == (B, L, H, d_k) and L != H:
            raise AssertionError(f"shape {tuple(result.shape)} is (B, L, H, d_k): move the heads before the "
                                 f"positions with .transpose(1, 2) to get (B, H, L, d_k)")
        if tuple(result.shape) == (B, H, d_k, L) and L != d_k:
            raise AssertionError(f"shape {tuple(result.shape)} is (B, H, d_k, L): the positions must come before the "
                                 "features, (B, H, L, d_k); view as (B, L, H, d_k), then transpose(1, 2) only")
        if tuple(result.shape) == (B, d_k, L, H) and H != d_k:
            raise AssertionError(f"shape {tuple(result.shape)}: split(n) and view(..., n, -1) cut pieces of SIZE n; "
                                 f"H heads are H pieces of size d_k = D / H: x.chunk(H, -1) or x.split(d_k, -1)")
        if tuple(result.shape) == (B * H, L, d_k):
            raise AssertionError(f"shape {tuple(result.shape)} is (B·H, L, d_k), nn.MultiheadAttention's internal "
                                 "layout; keep the heads as a dimension of their own: (B, H, L, d_k)")
        _name_a_misread_shape(result, x, expected, H)
        assert result.shape == expected.shape, (story or f"expected shape (B, H, L, d_k) = {tuple(expected.shape)} "
                                                f"for n_heads={H}, got {tuple(result.shape)}")
        if equal(result, x.reshape(B, H, L, d_k)) and not equal(result, expected):
            raise AssertionError("x.view(B, H, L, d_k) has the right shape but mixes positions and features: "
                                 "head 0 would get the first L·d_k numbers of the sentence (whole positions only when H "
                                 "divides L). View as (B, L, H, d_k), then transpose(1, 2)")
        if equal(result, x.view(B, L, d_k, H).permute(0, 3, 1, 2)) and not equal(result, expected):
            raise AssertionError("you cut the features as (d_k, H), so head i got features i, i + H, i + 2H, ...; "
                                 "view the last dimension as (H, d_k): head i holds the block i*d_k .. (i+1)*d_k - 1")
        _name_a_permute(result, x, expected, H)
        name_difference(result, expected, f"my_split_heads(x of shape {(B, L, D)}, n_heads={H}): ",
                        "; head i holds features i*d_k .. (i+1)*d_k - 1 of every position")
        assert equal(result, expected), (
            f"head i must hold features i*d_k .. (i+1)*d_k - 1 of every position; for x = arange, head 1 of "
            f"position 0 is {expected[0, 1, 0].tolist()}, yours is {result[0, 1, 0].tolist()}")
        assert equal(merge_heads(result), x), "merge_heads(my_split_heads(x)) must give x back"


def _name_a_permute(result: Tensor, x: Tensor, expected: Tensor, H: int) -> None:
    """A permute of the view (B, L, H, d_k) into another order of axes, then a reshape to the right shape: name the
    order (every order is tried, so no list of slips is needed)."""
    B, L, D = x.shape
    names, view = ("B", "L", "H", "d_k"), x.view(B, L, H, D // H)
    for order in itertools.permutations(range(4)):
        if order == (0, 2, 1, 3):
            continue
        wrong = view.permute(order).reshape(expected.shape)
        if equal(result, wrong) and not equal(wrong, expected):
            raise AssertionError(f"my_split_heads(x of shape {(B, L, D)}, n_heads={H}): you put the axes of the view "
                                 f"(B, L, H, d_k) in the order ({', '.join(names[i] for i in order)}), then reshaped to "
                                 "(B, H, L, d_k); a reshape keeps that order and only relabels the sizes. The order "
                                 "must be (B, H, L, d_k): .transpose(1, 2) of the view, nothing more")


def _name_a_misread_shape(result: Tensor, x: Tensor, expected: Tensor, H: int) -> None:
    """The sizes of x.shape unpacked in another order (L, B, D = x.shape), or the heads cut along another axis
    (x.chunk(H, dim=1), the positions): each is rebuilt and compared, whatever shape it gives."""
    B, L, D = x.shape
    names = {"B": B, "L": L, "D": D}
    for order in itertools.permutations("BLD"):
        b, l, d = (names[name] for name in order)
        if order == ("B", "L", "D") or d % H:
            continue
        wrong = x.reshape(b, l, H, d // H).transpose(1, 2)
        if wrong.shape == result.shape and equal(result, wrong) and not (wrong.shape == expected.shape and
                                                                        equal(wrong, expected)):
            raise AssertionError(f"my_split_heads(x of shape {(B, L, D)}, n_heads={H}): you read x.shape as "
                                 f"({', '.join(order)}); x is (B, L, D): B, L, D = x.shape, then view as "
                                 "(B, L, H, d_k) and transpose(1, 2)")
    for dim, axis in ((1, "the positions L (dim=1)"), (0, "the batch B (dim=0)")):
        for pieces in (x.chunk(H, dim=dim), x.split(max(x.size(dim) // H, 1), dim=dim)):
            if len({piece.shape for piece in pieces}) > 1:
                continue
            for wrong in (torch.stack(pieces, dim=1), torch.stack(pieces, dim=0)):
                if wrong.shape == result.shape and equal(result, wrong):
                    raise AssertionError(f"my_split_heads(x of shape {(B, L, D)}, n_heads={H}): you cut x along "
                                         f"{axis}; the heads split the FEATURES, the last dimension: head i holds "
                                         "features i*d_k .. (i+1)*d_k - 1 (x.chunk(H, dim=-1), or view and transpose)")


def check_split_heads(your_function) -> None:
    """Exercise 1 of notebook 05: (B, L, D) -> (B, H, L, d_k)."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("split heads", your_function, _check_split_heads)


def _by_hand(case: tuple, mask: str = "causal", scale: str = "sqrt(d_k)", out_proj: bool = True, dim: int = -1,
             split: str = "view", merge: str = "transpose", swap: bool = False, heads: str | int = "n_heads",
             fill: float = float("-inf"), query_from: str = "q_proj", key_from: str = "k_proj",
             value_from: str = "v_proj", zero_after: bool = False, bias: str = "all") -> Tensor:
    """Causal self-attention from the layer's projections, each step a knob: the defaults give the right
    answer, one knob turned one usual slip (`name_slip` tries them one and two at a time). `heads`: "n_heads",
    "one", or a number of heads; `bias`: "all", "none", "in" (q, k, v without), "out" (out_proj without)."""
    layer, x = case
    B, T, D = x.shape
    n_heads = layer.n_heads if heads == "n_heads" else 1 if heads == "one" else heads
    d_k = D // n_heads
    projections = {name: _linear(getattr(layer, name), bias not in ("none", "in"))
                   for name in ("q_proj", "k_proj", "v_proj")}
    do_split = split_heads if split == "view" else _split_without_transpose
    q, k, v = (do_split(projections[name](x), n_heads) for name in (query_from, key_from, value_from))
    if swap:
        q, k = k, q
    divisor = {"sqrt(d_k)": math.sqrt(d_k), "1": 1.0, "sqrt(d_model)": math.sqrt(D), "sqrt(n_heads)": math.sqrt(layer.n_heads),
               "d_k": float(d_k), "sqrt(T)": math.sqrt(T)}[scale]
    scores = q @ k.transpose(-2, -1) / divisor                           # (B, H, T, T)
    blocked = {"causal": subsequent_mask(T), "none": None, "one late": torch.triu(torch.ones(T, T, dtype=torch.bool), 2),
               "the past": subsequent_mask(T).T, "the diagonal too": torch.triu(torch.ones(T, T, dtype=torch.bool)),
               "inverted": ~subsequent_mask(T)}[mask]
    if blocked is not None and not zero_after:
        scores = scores.masked_fill(blocked, fill)
    weights = scores.softmax(dim=dim)
    if blocked is not None and zero_after:
        weights = weights.masked_fill(blocked, 0.0)
    out = weights @ v                                                    # (B, H, T, d_k)
    out = {"transpose": merge_heads, "no transpose": _merge_without_transpose,                 # (B, T, D)
           "features first": lambda o: o.permute(0, 2, 3, 1).reshape(B, T, D)}[merge](out)
    return _linear(layer.out_proj, bias not in ("none", "out"))(out) if out_proj else out


def _linear(projection: nn.Linear, with_bias: bool):
    """The projection, or its matrix alone (x @ W.T): a projection whose bias was left out."""
    return projection if with_bias else (lambda x: x @ projection.weight.T)


_ATTENTION_SLIPS = {  # each message, and the knobs of `_by_hand` that make its slip
    "no causal mask: position 0's output depends on later positions; block keys j > i with "
    "subsequent_mask(T) (True above the diagonal)": dict(mask="none"),
    "the causal mask is off by one: query i also sees key i + 1. Block every key j > i: "
    "torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)": dict(mask="one late"),
    "the mask blocks the PAST (keys j < i) instead of the future: True above the diagonal, "
    "torch.triu(..., diagonal=1), not tril": dict(mask="the past"),
    "the diagonal is blocked too, so query 0 has no key left (NaN): query i may attend to itself; block only the "
    "keys j > i, torch.triu(..., diagonal=1)": dict(mask="the diagonal too"),
    "the diagonal is blocked too (j >= i, torch.triu(..., diagonal=0)): query i may attend to itself. With a finite "
    "fill such as -1e9, query 0 has no key left and spreads its weight evenly over EVERY key, the future included; "
    "block only the keys j > i, torch.triu(..., diagonal=1)": dict(mask="the diagonal too", fill=-1e9),
    "the mask is inverted: True (blocked) must be ABOVE the diagonal, the future keys; yours lets each query see "
    "only the future": dict(mask="inverted"),
    "the masked scores were filled with 0, and exp(0) = 1 is not a zero weight: fill them with -inf "
    "(scores.masked_fill(mask, float('-inf')))": dict(fill=0.0),
    "you zeroed the masked weights AFTER the softmax, so each row no longer sums to 1: fill the masked scores with "
    "-inf BEFORE the softmax": dict(zero_after=True),
    "the scale is sqrt(d_model); each head divides by sqrt(d_k) = sqrt(d_model / n_heads)": dict(scale="sqrt(d_model)"),
    "the scores were not scaled: divide them by sqrt(d_k) = sqrt(d_model / n_heads)": dict(scale="1"),
    "the scores were divided by d_k; eq. 1 divides by its square root, sqrt(d_k)": dict(scale="d_k"),
    "the scale is sqrt(n_heads); each head divides by sqrt(d_k) = sqrt(d_model / n_heads)": dict(scale="sqrt(n_heads)"),
    "the scores were divided by sqrt(T), the number of positions; eq. 1 divides by sqrt(d_k), the size of a head":
        dict(scale="sqrt(T)"),
    "no output projection: apply layer.out_proj to the merged heads": dict(out_proj=False),
    "the softmax ran over the queries (dim=-2); normalise over the keys, dim=-1": dict(dim=-2),
    "queries and keys are swapped: scores[i, j] = q_i · k_j with q from layer.q_proj, k from layer.k_proj "
    "(q @ k.transpose(-2, -1))": dict(swap=True),
    "the keys came from layer.q_proj; keys come from layer.k_proj: k = layer.k_proj(x)": dict(key_from="q_proj"),
    "the values came from layer.q_proj; values come from layer.v_proj: v = layer.v_proj(x)": dict(value_from="q_proj"),
    "the values came from layer.k_proj; values come from layer.v_proj: v = layer.v_proj(x)": dict(value_from="k_proj"),
    "keys and values both came from layer.q_proj; k = layer.k_proj(x), v = layer.v_proj(x)":
        dict(key_from="q_proj", value_from="q_proj"),
    "the queries came from layer.k_proj; queries come from layer.q_proj: q = layer.q_proj(x)": dict(query_from="k_proj"),
    "the queries came from layer.v_proj; queries come from layer.q_proj: q = layer.q_proj(x)": dict(query_from="v_proj"),
    "the keys came from layer.v_proj; keys come from layer.k_proj: k = layer.k_proj(x)": dict(key_from="v_proj"),
    "the biases of the projections are missing: x @ W.T drops them; apply each projection as a layer, "
    "layer.q_proj(x) (= x @ W.T + b), or add its .bias": dict(bias="none"),
    "the biases of q_proj, k_proj and v_proj are missing (x @ W.T drops them): apply them as layers, "
    "layer.q_proj(x), or add their .bias": dict(bias="in"),
    "the bias of out_proj is missing (out @ W.T drops it): apply it as a layer, layer.out_proj(out), or add its "
    ".bias": dict(bias="out"),
    "you used ONE head of size d_model: split q, k and v into layer.n_heads heads of size d_k first":
        dict(heads="one", scale="sqrt(d_model)"),
    "the heads were split with a view to (B, H, T, d_k) without the transpose, which mixes positions and "
    "features: view as (B, T, H, d_k), then transpose(1, 2)": dict(split="no transpose"),
    "the heads were merged with a reshape of (B, H, T, d_k) to (B, T, D) without moving the heads back: "
    "transpose(1, 2) first, then reshape": dict(merge="no transpose"),
    "the heads were merged as (B, T, d_k, H), features before heads: position t's output must hold head 0's d_k "
    "features, then head 1's, ...: out.transpose(1, 2).reshape(B, T, D)": dict(merge="features first"),
}


def _split_without_transpose(x: Tensor, n_heads: int) -> Tensor:
    B, T, D = x.shape
    return x.reshape(B, n_heads, T, D // n_heads)                        # (B, H, T, d_k), features mixed up


def _merge_without_transpose(x: Tensor) -> Tensor:
    B, H, T, d_k = x.shape
    return x.reshape(B, T, H * d_k)                                      # (B, H, T, d_k) read as (B, T, D)


def _refuse_the_layer(module, args):
    raise AssertionError("causal_self_attention called the layer itself; use its projections "
                         "layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj instead")


def _head_slips(D: int, H: int) -> dict[str, dict]:
    """A number of heads other than layer.n_heads (one written in the code): every other divisor of D."""
    return {f"you split into {h} heads; this layer has layer.n_heads = {H}: read the number of heads from "
            f"layer.n_heads, and d_k = D // layer.n_heads": dict(heads=h)
            for h in range(2, D + 1) if D % h == 0 and h != H}


def _check_causal_self_attention(causal_self_attention) -> None:
    fresh = fresh_generator()
    H, d_k = int(torch.randint(1, 5, (), generator=fresh)), int(torch.randint(1, 6, (), generator=fresh))
    for B, T, D, H, generator in ((2, 5, 24, 4, torch.Generator().manual_seed(5)),   # d_k = 6: sqrt(d_k) != sqrt(H)
                                  (2, 3, 8, 2, torch.Generator().manual_seed(7)),    # another H: none written in
                                  (1, 4, 6, 1, torch.Generator().manual_seed(6)),    # one sentence, one head
                                  (int(torch.randint(1, 4, (), generator=fresh)),
                                   int(torch.randint(2, 8, (), generator=fresh)), H * d_k, H, fresh)):
        _check_attention_with(causal_self_attention, B, T, D, H, generator)


def _check_attention_with(causal_self_attention, B: int, T: int, D: int, H: int, generator: torch.Generator) -> None:
    layer = MultiHeadAttention(D, H).eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    x = torch.randn(B, T, D, generator=generator)                        # (B, T, D)
    causal = subsequent_mask(T)                                          # (T, T): True above the diagonal
    hook = layer.register_forward_pre_hook(_refuse_the_layer)
    try:
        result = call(causal_self_attention, x, layer, refuse=_NO_LIBRARY_ATTENTION,
                      on=f"x of shape (B={B}, T={T}, D={D}) and a MultiHeadAttention({D}, n_heads={H})",
                      hint=lambda e: (f"the shapes did not fit for this layer, D = {D} and layer.n_heads = {H}, so "
                                      f"d_k = {D // H}: take the number of heads from layer.n_heads, d_k = D // "
                                      "layer.n_heads, and B, T from x.shape; print the shapes of q, k and v"
                                      if isinstance(e, RuntimeError) else None))
    finally:
        hook.remove()
    with torch.no_grad():
        expected, _ = layer(x, x, x, attn_mask=causal)
    d_k = D // H
    assert isinstance(result, Tensor), f"causal_self_attention must return a torch.Tensor, got {type(result).__name__}"
    result = result.detach()
    if result.shape != expected.shape:
        story = shape_story(tuple(result.shape), tuple(expected.shape), ("B", "T", "D"))
        raise AssertionError(f"causal_self_attention: {story or f'expected shape (B, T, D) = {tuple(expected.shape)}, got {tuple(result.shape)}'}")
    if allclose(result, expected, atol=1e-5, rtol=1e-4):
        return
    with torch.no_grad():
        slip = name_slip([result], [(layer, x)], _by_hand, _ATTENTION_SLIPS | _head_slips(D, H),
                         lambda got, wrong: bool(allclose(got, wrong, atol=1e-5, rtol=1e-4, equal_nan=True)))
    if slip:
        raise AssertionError(f"causal_self_attention (B={B}, T={T}, D={D}, n_heads={H}): {slip}")
    assert not result.isnan().any(), (
        "NaN in the output: some query has every key blocked, or a 0 · inf. Query i may attend to keys 0..i, itself "
        "included, so the mask is True (blocked) only above the diagonal: torch.triu(ones, diagonal=1), not "
        "diagonal=0, and not inverted; and fill with masked_fill, not by multiplying by inf")
    later = x.clone()
    later[:, -1] += 1.0                                                  # change only the last position
    hook = layer.register_forward_pre_hook(_refuse_the_layer)
    try:
        moved = call(causal_self_attention, later, layer, refuse=_NO_LIBRARY_ATTENTION,
                     on="x with its last position changed")
    finally:
        hook.remove()
    if T > 1 and not allclose(moved.detach()[:, :-1], result[:, :-1], atol=1e-6):
        raise AssertionError("changing x at the LAST position changed the outputs at earlier positions: your attention "
                             "is not causal. Block the keys j > i of each query i before the softmax "
                             "(masked_fill(subsequent_mask(T), -inf))")
    wrong_at = (~tensor_isclose(result, expected, atol=1e-5, rtol=1e-4)).any(dim=-1)   # (B, T)
    positions = wrong_at.any(dim=0).nonzero().flatten().tolist()
    if positions and positions != list(range(T)):
        raise AssertionError(f"causal_self_attention is right at positions {sorted(set(range(T)) - set(positions))} "
                             f"and wrong at positions {positions} (B={B}, T={T}): position 0 has one key, itself, "
                             "whose weight is 1 whatever its score, so its output checks only the values (v_proj), "
                             "the head split and merge and out_proj; the later positions add all that makes the "
                             "scores: the queries (q_proj) and keys (k_proj), the scale, the mask and the softmax")
    name_difference(result, expected, "causal_self_attention: ", "; compare your steps with MultiHeadAttention.forward",
                    {"sqrt(d_k)": math.sqrt(d_k), "sqrt(d_model)": math.sqrt(D)})
    assert_close(result, expected, atol=1e-5, rtol=1e-4, msg=lambda m: (
        "causal_self_attention differs from layer(x, x, x, attn_mask=subsequent_mask(T))[0], and not by one of "
        "the usual slips (mask, scale, softmax axis, head split or merge, projections) or two of them. Compare "
        f"your steps one by one with MultiHeadAttention.forward: {m}"))


def check_causal_self_attention(your_function) -> None:
    """Exercise 2 of notebook 05: causal multi-head self-attention from a layer's projections."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("causal self-attention with H heads", your_function, _check_causal_self_attention)
