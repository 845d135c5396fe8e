"""Checkers for the coding exercises of notebook 12 (decoding). Hand-written, not exported.

* `check_length_normalised_score`: beam search's ranking score log P(Y) / lp(Y) with GNMT's length
  penalty lp(Y) = ((5 + |Y|) / 6)^α, compared with the course's `length_penalty`.
* `check_greedy_decode`: greedy decoding written from scratch, compared with the course's
  `greedy_decode` on tiny random Transformers and on hand-built models whose sentences end at different
  steps; those models and the decoder's usual slips are in `transformer_lib.exercises.greedy`.
"""
import contextlib
import math
import sys

import torch

from transformer_lib.decoding import length_penalty
from transformer_lib.exercises import Refuse, call, fresh_random, run_checker
from transformer_lib.exercises.explain import is_number, name_slip, number_expected, regime, what_it_is, where_wrong
from transformer_lib.exercises.greedy import greedy_checks
from transformer_lib.exercises.guards import assert_close, isclose

_NO_LENGTH_PENALTY = [Refuse(length_penalty, "write lp(Y) = ((5 + |Y|) / 6) ** α yourself, without calling the "
                             "course's length_penalty")]


def _score_cases():
    for log_prob in (-0.5, -3.0, -12.25):
        for length in (1, 2, 7, 30):
            for alpha in (0.0, 0.6, 1.0, 1.5):
                yield log_prob, length, alpha
    rng = fresh_random()
    for _ in range(3):
        yield -round(rng.uniform(0.01, 40), 4), rng.randint(3, 80), round(rng.uniform(0.1, 2), 3)


def _real(value) -> float:
    return math.nan if isinstance(value, complex) else float(value)


class _Raised:
    """What a call gave when it raised: the exception's type, compared by name."""

    def __init__(self, error: BaseException):
        self.kind = type(error).__name__

    def __repr__(self) -> str:
        return f"raised {self.kind}"


def _score_variant(case, offset=5, divisor=6, power="whole", apply="divide", also_by_length=False, floor=False):
    """The reference log P / ((5 + |Y|) / 6)^α with each step a knob; an exception is an outcome like a value."""
    log_prob, length, alpha = case
    try:
        base = (offset + length) // divisor if floor else (offset + length) / divisor
        lp = {"whole": lambda: base ** alpha, "factor": lambda: base * alpha, "none": lambda: base,
              "sum only": lambda: (offset + length) ** alpha / divisor,
              "divisor only": lambda: (offset + length) / divisor ** alpha,
              "length only": lambda: length ** alpha,
              "length over divisor": lambda: (offset + length / divisor) ** alpha}[power]()
        score = log_prob / lp if apply == "divide" else log_prob * lp
        return score / length if also_by_length else score
    except ArithmeticError as error:
        return _Raised(error)


_SCORE_SLIPS = {
    "lp(Y) divides 5 + |Y| by 6, so that lp = 1 for a one-token output: ((5 + |Y|) / 6)^α": {"divisor": 1},
    "divide log P by lp(Y); multiplying makes long outputs even worse": {"apply": "multiply"},
    "you multiplied by α; lp(Y) RAISES (5 + |Y|) / 6 to the power α: ((5 + |Y|) / 6) ** α": {"power": "factor"},
    "raise (5 + |Y|) / 6 to the power α": {"power": "none"},
    "GNMT's penalty is ((5 + |Y|) / 6)^α, not |Y|^α": {"power": "length only"},
    "the exponent α applies to the whole fraction: ((5 + |Y|) / 6)^α, not (5 + |Y|) / 6^α":
        {"power": "divisor only"},
    "the exponent α applies to the whole fraction: ((5 + |Y|) / 6)^α, not (5 + |Y|)^α / 6": {"power": "sum only"},
    "divide the sum by 6: ((5 + |Y|) / 6)^α, not (5 + |Y| / 6)^α (mind the parentheses)":
        {"power": "length over divisor"},
    "divide by lp(Y) only, not also by the length |Y|: lp already carries the length": {"also_by_length": True},
    "(5 + |Y|) // 6 is integer division; divide with /: ((5 + |Y|) / 6)^α": {"floor": True},
}
# A wrong constant: every other small number in the place of the 5 and of the 6, found by evaluating them all.
_SCORE_SLIPS |= {f"GNMT adds 5 to the length, you added {k}: ((5 + |Y|) / 6)^α, so that lp = 1 for |Y| = 1":
                 {"offset": k} for k in range(0, 13) if k != 5}
_SCORE_SLIPS |= {f"GNMT divides 5 + |Y| by 6, you divided by {k}: ((5 + |Y|) / 6)^α, so that lp = 1 for |Y| = 1":
                 {"divisor": k} for k in range(2, 13) if k != 6}


def _same_outcome(got, wrong) -> bool:
    if isinstance(got, _Raised) or isinstance(wrong, _Raised):
        return isinstance(got, _Raised) and isinstance(wrong, _Raised) and got.kind == wrong.kind
    return not isinstance(wrong, complex) and isclose(got, wrong, rel_tol=1e-6, abs_tol=1e-12)


def _score_hint(error: Exception) -> str | None:
    if isinstance(error, ZeroDivisionError):
        return ("the right score is defined here (lp(Y) = ((5 + |Y|) / 6)^α is at least 1 for |Y| ≥ 1, never 0): "
                "your divisor is not lp(Y)")
    return None


def _tensor_hint(error: Exception, math_functions: list) -> str | None:
    if math_functions:
        return (f"math.{math_functions[-1]} works on numbers only: use ** (and torch functions), which work on "
                "numbers and tensors alike")
    if "converted to" in str(error) and ("scalar" in str(error).lower()):
        return ("a tensor of several hypotheses was turned into one Python number (float(...), int(...) or .item() "
                "on a tensor does that): keep every step an operation that works on tensors, and return what it "
                "gives, without converting it")
    return None


@contextlib.contextmanager
def _math_functions_that_raised():
    """Record the name of each function of the `math` module that raised while the block ran."""
    names, previous = [], sys.getprofile()

    def hook(frame, event, arg):
        if event == "c_exception" and getattr(arg, "__module__", None) == "math":
            names.append(arg.__name__)
    sys.setprofile(hook)
    try:
        yield names
    finally:
        sys.setprofile(previous)


def _check_score(your_function) -> None:
    cases, outcomes, returned, first_error = list(_score_cases()), [], None, None
    for log_prob, length, alpha in cases:
        where = f"log_prob={log_prob}, length={length}, alpha={alpha}"
        try:
            got = call(your_function, log_prob, length, alpha, on=where, refuse=_NO_LENGTH_PENALTY, hint=_score_hint)
        except AssertionError as error:
            if error.__cause__ is None:                  # a refusal, or a changed input: as it is
                raise
            outcomes.append(_Raised(error.__cause__))
            first_error = first_error or error
            continue
        assert not isinstance(got, complex), (f"{where} gave the complex number {got}: raise only lp to the power "
                                              "α, never the negative log P")
        assert isinstance(got, (int, float)) or (torch.is_tensor(got) and got.numel() == 1) or (
            hasattr(got, "__float__") and getattr(got, "ndim", 0) == 0), f"return a number, got {what_it_is(got)}"
        outcomes.append(float(got))
        returned = returned if returned is not None or is_number(got) else got
    expected = [_score_variant(case) for case in cases]
    wrong = [i for i, (got, right) in enumerate(zip(outcomes, expected)) if not _same_outcome(got, right)]
    if wrong:
        i = wrong[0]
        (log_prob, length, alpha), got = cases[i], outcomes[i]
        said = (f"log_prob={log_prob}, length={length}, alpha={alpha}: expected {expected[i]:.6f}, " +
                (f"your function {got}" if isinstance(got, _Raised) else f"got {got:.6f}"))
        slip = name_slip(outcomes, cases, _score_variant, _SCORE_SLIPS, _same_outcome, pairs=False)
        if slip:
            raise AssertionError(f"{said}. {slip[0].upper()}{slip[1:]}.")
        if isinstance(got, _Raised):
            raise first_error
        right = [i not in wrong for i in range(len(cases))]
        regime_said = regime(cases, right, lambda c: (
            "for α = 0 or |Y| = 1 (lp = 1)" if c[2] == 0 or c[1] == 1 else "for α > 0 and |Y| > 1")) or where_wrong(
            right, cases, {"for α = 0": lambda c: c[2] == 0, "for |Y| = 1": lambda c: c[1] == 1,
                           "for α > 1": lambda c: c[2] > 1, "for α < 1": lambda c: c[2] < 1,
                           "for |Y| ≥ 20": lambda c: c[1] >= 20, "for |Y| ≤ 2": lambda c: c[1] <= 2,
                           "for log P < −10": lambda c: c[0] < -10})
        raise AssertionError(f"{said}. " + (
            f"Your score is {regime_said}: with α = 0 the score is log P itself, and for α > 0 it is "
            "log P / ((5 + |Y|) / 6)^α." if regime_said else "The score is log P / ((5 + |Y|) / 6)^α."))
    if returned is not None:
        number_expected(returned, "every case gave the right value")
    lengths = torch.tensor([1.0, 4.0, 13.0])
    with _math_functions_that_raised() as math_functions:
        got = call(your_function, torch.tensor([-1.0, -2.0, -3.0]), lengths, 0.6, on="log_prob and length as tensors "
                   "of 3 hypotheses", hint=lambda error: _tensor_hint(error, math_functions), refuse=_NO_LENGTH_PENALTY)
    assert isinstance(got, torch.Tensor) and got.shape == (3,), (
        f"given tensors of 3 log-probabilities and lengths, return a tensor of the same shape (3,), got "
        f"{what_it_is(got)}: " + ("math functions work on numbers only (use **)" if math_functions else
                                  "no float(...), .item() or math function on the way"))
    assert_close(got, torch.tensor([-1.0, -2.0, -3.0]) / length_penalty(lengths, 0.6))


def check_length_normalised_score(your_function) -> None:
    """Check `your_function(log_prob, length, alpha) -> log_prob / lp(length)`."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("length-normalised score", your_function, _check_score)


def check_greedy_decode(your_function) -> None:
    """Check `your_function(model, src, src_key_padding_mask, bos_id, eos_id, max_len) -> list[list[int]]`."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("greedy decoding", your_function, greedy_checks)
