"""Naming a wrong answer that no listed slip explains (hand-written, not exported).

When a learner's tensor differs from the right one, `tensor_difference` looks for a simple shape in the
difference (a constant offset or factor, a transpose, a flipped sign, the right values in another order,
only some rows wrong) and says it in one sentence, so that a message names the mistake instead of
printing two tensors; `dropout_story` recognises dropout left on (entries zeroed, the others scaled up).
`regime` does the same for a function of numbers: on which of the cases it was right and on which wrong.

Beyond a list of slips: `name_slip` derives them from the reference solution (each step a knob; a slip is
one knob turned, a pair two) and names the one the learner's outputs match on the same fresh cases; where
none does, `where_wrong` says what the failing cases share, `shape_story` how a shape differs axis by axis,
and `weight_invariants` which property of attention weights breaks. `what_it_is` and `number_expected` say which
type a function returned where its statement asks for another (a Python bool, a number, an int, a list).
"""
import numbers
from collections.abc import Callable

import torch
from torch import Tensor

from transformer_lib.exercises.guards import allclose, isclose, tensor_isclose


def what_it_is(value) -> str:
    """A returned value's type in words ("a tensor of shape () (0.25, torch.float32)", "a numpy.float32 (0.5)",
    "an itertools.islice"), for a message that says what the statement asks for instead."""
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}" + (f" ({value.item()!r}, {value.dtype})"
                                                             if value.numel() == 1 else "")
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__name__}"
    text = repr(value)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}" + (f" ({text})" if len(text) <= 40 and " object at " not in text
                                                                else "")


def _reduced_precision(value) -> bool:
    """A NumPy float of fewer than 64 bits (np.float32, np.float16): a number, but one that rounds at 7 (or 3)
    digits, as a float32 tensor does."""
    return (isinstance(value, numbers.Real) and not isinstance(value, (int, float))
            and getattr(getattr(value, "dtype", None), "kind", "") == "f" and value.dtype.itemsize < 8)


def is_number(value) -> bool:
    """A Python number, or a NumPy one as precise (np.float64 is a float, np.int64 an integer); not a bool, a
    tensor, or a np.float32 / np.float16, which round at 7 (3) digits."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not _reduced_precision(value)


def is_int(value) -> bool:
    """A Python (or NumPy) integer, not a bool, a float or a tensor."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def number_expected(value, where: str, kind: str = "number") -> None:
    """Raise AssertionError when the statement asks for a number (`kind` "number") or an int ("int") and `value`
    is another type: say what was returned and how to turn it into what is asked."""
    if (is_int if kind == "int" else is_number)(value):
        return
    fix = ("turn a one-element tensor into a number with .item()" if isinstance(value, Tensor) and value.numel() == 1
           else f"it keeps only {7 if value.dtype.itemsize == 4 else 3} significant digits: compute with Python floats "
                "(math, not NumPy's float32), or return float(...) of a float64" if _reduced_precision(value)
           else "compute it with Python numbers (math, not torch)")
    if kind == "int" and is_number(value):
        fix = "count with ints (// or int(...)), not floats"
    raise AssertionError(f"{where}: return {'an int' if kind == 'int' else 'a number (int or float)'}, as the "
                         f"statement asks; you returned {what_it_is(value)}: {fix}")


def _constant(values: Tensor) -> float | None:
    values = values.flatten()
    if values.numel() > 1 and allclose(values, values[0].expand_as(values), rtol=1e-4, atol=1e-6):
        return float(values[0])
    return None


def tensor_difference(got: Tensor, expected: Tensor, factors: dict[str, float] | None = None) -> str | None:
    """One sentence on how `got` differs from `expected`, or None when the difference has no simple shape.
    `factors` names the numbers a wrong scale is likely to be ({"sqrt(d_model)": 16.0, ...})."""
    if not isinstance(got, Tensor) or got.shape != expected.shape or got.numel() < 2:
        return None
    got, expected = got.detach().double(), expected.detach().double()
    if not got.isfinite().all():
        return "it holds NaN or inf where the right answer is finite"
    close = tensor_isclose(got, expected, rtol=1e-4, atol=1e-5)
    offset = _constant(got - expected)
    if offset is not None:
        return f"every entry is off by the same constant, {offset:+.4g}"
    nonzero = expected.abs() > 1e-6
    factor = _constant(got[nonzero] / expected[nonzero]) if nonzero.sum() > 1 else None
    if factor is not None and not allclose(got[~nonzero], torch.zeros_like(got[~nonzero]), atol=1e-5):
        factor = None
    if factor is not None:
        named = next((f" = {name}" for name, value in (factors or {}).items()
                      if isclose(abs(factor), value, rel_tol=1e-4) or isclose(abs(factor), 1 / value, rel_tol=1e-4)), "")
        return f"every entry is {factor:.4g}{named} times the right one"
    if allclose(got, -expected, rtol=1e-4, atol=1e-5):
        return "every entry has the wrong sign"
    if got.dim() >= 2 and got.shape[-1] == got.shape[-2] and allclose(got, expected.transpose(-1, -2), atol=1e-5):
        return "it is the right answer transposed: the last two axes are swapped"
    if allclose(got.sort(dim=-1).values, expected.sort(dim=-1).values, atol=1e-5):
        return "it holds the right values in the wrong order along the last axis"
    if allclose(got.flatten().sort().values, expected.flatten().sort().values, atol=1e-5):
        return "it holds the right values, but in the wrong places (a reshape or permute that mixes the axes?)"
    if got.dim() >= 2:
        rows = (~close).flatten(0, -2).any(dim=-1)                           # which rows (all but the last axis)
        if 0 < int(rows.sum()) <= rows.numel() // 2:                        # a few rows: say which
            index = [tuple(i) for i in (~close).any(dim=-1).nonzero().tolist()][:4]
            return (f"{int(rows.sum())} of its {rows.numel()} rows are wrong (the others are right), first at "
                    f"index {', '.join(map(str, index))}")
    return None


def dropout_story(got: Tensor, clean: Tensor) -> str | None:
    """When `got` is `clean` with some entries zeroed and the others multiplied by one factor c > 1 (dropout in
    training mode, p = 1 − 1/c), say so; None otherwise."""
    if not isinstance(got, Tensor) or got.shape != clean.shape or clean.numel() < 2:
        return None
    got, clean = got.detach().double(), clean.detach().double()
    live = clean.abs() > 1e-6
    zeroed = live & (got.abs() <= 1e-9)
    kept = live & ~zeroed
    if int(kept.sum()) < 2 or not zeroed.any():
        return None
    factor = _constant(got[kept] / clean[kept])
    if factor is None or factor <= 1 + 1e-3 or not allclose(got[~live], torch.zeros_like(got[~live]), atol=1e-5):
        return None
    return (f"some of its entries are 0 and the others are the right ones times {factor:.4g} = "
            f"1/(1 − {1 - 1 / factor:.2g}): that is dropout in training mode (F.dropout drops unless "
            "training=False; an nn.Dropout drops while its module is in train())")


def regime(cases: list, right: list[bool], describe) -> str | None:
    """`describe(case)` gives each case a regime name ("before the warmup"); if the answer is right in every case
    of some regimes and wrong in every case of the others, say which."""
    by_regime: dict[str, set[bool]] = {}
    for case, ok in zip(cases, right):
        by_regime.setdefault(describe(case), set()).add(ok)
    good = [name for name, oks in by_regime.items() if oks == {True}]
    bad = [name for name, oks in by_regime.items() if oks == {False}]
    if good and bad and len(good) + len(bad) == len(by_regime):
        return f"right {' and '.join(good)}, but wrong {' and '.join(bad)}"
    return None


def name_difference(got, expected: Tensor, before: str, after: str = "", factors: dict[str, float] | None = None) -> None:
    """Raise AssertionError(before + how `got` differs + after) when it is wrong and the difference has a simple
    shape; otherwise return, and the caller's own check reports the difference."""
    if not isinstance(got, Tensor) or got.shape != expected.shape:
        return
    if allclose(got.detach().double(), expected.detach().double(), rtol=1e-4, atol=1e-5):
        return
    named = tensor_difference(got, expected, factors)
    if named:
        raise AssertionError(f"{before}{named}{after}")


def name_slip(outputs: list, cases: list, variant: Callable, slips: dict[str, dict], same: Callable,
              pairs: bool = True) -> str | None:
    """Name the slip that explains a wrong answer, from mutants of the reference solution.

    `variant(case, **knobs)` is the reference solution with each step as a knob; with no knobs it is the right
    answer. `slips` maps each message to the knobs that turn one step into its usual slip (a wrong axis, a
    missing scale, an inverted mask, ...). Each slip, then each pair of slips that touch different knobs, is
    evaluated on the same cases as the learner's `outputs`; the first whose outputs are `same(got, wrong)` on
    every case, and that differs from the reference on at least one, is named (a pair: both messages).
    """
    memo: dict[tuple, object] = {}

    def output(knobs: dict, i: int):
        key = (tuple(sorted((k, repr(v)) for k, v in knobs.items())), i)
        if key not in memo:
            try:
                memo[key] = variant(cases[i], **knobs)
            except Exception:                        # a slip that cannot run on this case explains nothing
                memo[key] = _FAILED
        return memo[key]

    def explains(knobs: dict) -> bool:
        visible = False
        for i, got in enumerate(outputs):
            wrong = output(knobs, i)
            if wrong is _FAILED or not same(got, wrong):
                return False
            visible = visible or not same(output({}, i), wrong)
        return visible

    for message, knobs in slips.items():
        if explains(knobs):
            return message
    if pairs:
        items = list(slips.items())
        for a, (first, knobs_a) in enumerate(items):
            for second, knobs_b in items[a + 1:]:
                if first != second and not knobs_a.keys() & knobs_b.keys() and explains(knobs_a | knobs_b):
                    return f"two slips at once: {first}; and {second}"
    return None


_FAILED = object()


def where_wrong(right: list[bool], cases: list, features: dict[str, Callable]) -> str | None:
    """Which cases a wrong answer fails, said by what they share: `features` maps a description ("with
    padding", "for B = 1", "past the warmup") to a predicate of a case; the first whose cases are exactly the
    failing ones (or exactly the passing ones) is said. None when none separates them."""
    wrong = [not ok for ok in right]
    if not any(wrong) or all(wrong):
        return None
    for description, has in features.items():
        marks = [bool(has(case)) for case in cases]
        if marks == wrong:
            return f"wrong only {description}, right in every other case"
        if marks == right:
            return f"right only {description}, wrong in every other case"
    return None


def shape_story(got: tuple, expected: tuple, names: tuple[str, ...]) -> str | None:
    """How a wrong shape differs from the right one, axis by axis (`names`: the letters of the right shape's
    axes, ("B", "H", "L", "d_k")). None when no simple story fits."""
    got, expected = tuple(got), tuple(expected)
    if got == expected:
        return None
    layout = "(" + ", ".join(names) + ")"
    if len(got) == len(expected) - 1:
        for axis, size in enumerate(expected):
            if size == 1 and expected[:axis] + expected[axis + 1:] == got:
                return (f"the axis {names[axis]} of size 1 is gone: shape {got} where {layout} = {expected} is "
                        f"expected. squeeze() drops EVERY axis of size 1 (here {names[axis]} = 1); keep the axes "
                        "(squeeze(dim) only the one you mean, or index instead)")
    if len(got) == len(expected) + 1:
        for axis in range(len(got)):
            if got[axis] == 1 and got[:axis] + got[axis + 1:] == expected:
                return (f"an extra axis of size 1 at position {axis}: shape {got} where {layout} = {expected} is "
                        "expected (a keepdim=True, unsqueeze or [:, None] too many)")
    if len(got) == len(expected) and sorted(got) == sorted(expected) and len(set(expected)) == len(expected):
        order = ", ".join(names[expected.index(size)] for size in got)
        return f"the axes are in the order ({order}), shape {got}; the right order is {layout} = {expected}"
    if len(got) == len(expected):
        wrong = [i for i in range(len(got)) if got[i] != expected[i]]
        if len(wrong) == 1:
            i = wrong[0]
            return (f"axis {names[i]} has size {got[i]} where {expected[i]} is expected: shape {got}, "
                    f"expected {layout} = {expected}")
    return None


def weight_invariants(weights: Tensor, blocked: Tensor, atol: float = 1e-5) -> str | None:
    """The first invariant of attention weights that `weights` breaks, with where: every weight in [0, 1],
    masked weights exactly 0, each row with a key to attend to summing to 1, a row with none all 0."""
    weights = weights.detach().double()
    full = blocked.all(dim=-1)                                            # (..., Lq): rows with no key left
    if (weights < -atol).any() or (weights > 1 + atol).any():
        return "some weights are outside [0, 1], which probabilities never are"
    if (weights[blocked] != 0).any():
        return "some masked entries (mask True) got a weight other than 0"
    sums = weights.sum(dim=-1)
    bad = ~tensor_isclose(sums, torch.ones_like(sums), atol=1e-4) & ~full
    if bad.any():
        first = tuple(bad.nonzero()[0].tolist())
        return (f"{int(bad.sum())} of the {int((~full).sum())} rows that have keys to attend to do not sum to 1 "
                f"(first at index {first}, sum {sums[first].item():.4g})")
    return None
