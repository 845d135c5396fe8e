"""Naming a wrong answer that no listed slip explains (hand-written, not exported).

When a learner's tensor differs from the right one, `tensor_difference` looks for a simple shape in the
difference (a constant offset or factor, a transpose, a flipped sign, the right values in another order,
only some rows wrong) and says it in one sentence, so that a message names the mistake instead of
printing two tensors. `regime` does the same for a function of numbers: on which of the cases it was
right and on which wrong.
"""
import math

import torch
from torch import Tensor


def _constant(values: Tensor) -> float | None:
    values = values.flatten()
    if values.numel() > 1 and torch.allclose(values, values[0].expand_as(values), rtol=1e-4, atol=1e-6):
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
    close = torch.isclose(got, expected, rtol=1e-4, atol=1e-5)
    offset = _constant(got - expected)
    if offset is not None:
        return f"every entry is off by the same constant, {offset:+.4g}"
    nonzero = expected.abs() > 1e-6
    factor = _constant(got[nonzero] / expected[nonzero]) if nonzero.sum() > 1 else None
    if factor is not None and not torch.allclose(got[~nonzero], torch.zeros_like(got[~nonzero]), atol=1e-5):
        factor = None
    if factor is not None:
        named = next((f" = {name}" for name, value in (factors or {}).items()
                      if math.isclose(abs(factor), value, rel_tol=1e-4) or math.isclose(abs(factor), 1 / value, rel_tol=1e-4)), "")
        return f"every entry is {factor:.4g}{named} times the right one"
    if torch.allclose(got, -expected, rtol=1e-4, atol=1e-5):
        return "every entry has the wrong sign"
    if got.dim() >= 2 and got.shape[-1] == got.shape[-2] and torch.allclose(got, expected.transpose(-1, -2), atol=1e-5):
        return "it is the right answer transposed: the last two axes are swapped"
    if torch.allclose(got.sort(dim=-1).values, expected.sort(dim=-1).values, atol=1e-5):
        return "it holds the right values in the wrong order along the last axis"
    if torch.allclose(got.flatten().sort().values, expected.flatten().sort().values, atol=1e-5):
        return "it holds the right values, but in the wrong places (a reshape or permute that mixes the axes?)"
    if got.dim() >= 2:
        rows = (~close).flatten(0, -2).any(dim=-1)                           # which rows (all but the last axis)
        if 0 < int(rows.sum()) <= rows.numel() // 2:                        # a few rows: say which
            index = [tuple(i) for i in (~close).any(dim=-1).nonzero().tolist()][:4]
            return (f"{int(rows.sum())} of its {rows.numel()} rows are wrong (the others are right), first at "
                    f"index {', '.join(map(str, index))}")
    return None


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
    if torch.allclose(got.detach().double(), expected.detach().double(), rtol=1e-4, atol=1e-5):
        return
    named = tensor_difference(got, expected, factors)
    if named:
        raise AssertionError(f"{before}{named}{after}")
