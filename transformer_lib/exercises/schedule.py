"""The checks behind notebook 11's learning-rate exercises: the Noam rate (eq. 3) and its cooldown.

Hand-written, not exported (see `transformer_lib.exercises`). The public `check_noam_lr` and `check_cooldown`
live in `transformer_lib.exercises.training`, one module per notebook; this module holds what they compare with:
`transformer_lib.schedule.noam_lr`, the usual slips of eq. 3 and of the cooldown ramp, each as a variant.
"""
import math

import torch

from transformer_lib.exercises import Refuse, call, fresh_random
from transformer_lib.exercises.explain import is_number, name_slip, number_expected, regime, what_it_is
from transformer_lib.exercises.guards import isclose
from transformer_lib.schedule import cooldown_factor, noam_lr

_NO_NOAM_LR = [Refuse(noam_lr, "noam_lr is the course's own eq. 3, the function this exercise asks you to write")]
_NO_COOLDOWN_FACTOR = [Refuse(cooldown_factor, "cooldown_factor is the course's own ramp, the one this exercise asks "
                              "you to write: min(1, (1 − progress) / cooldown)")]


def _noam_slips(step: int, d: int, w: int) -> dict[str, float]:
    linear, decay = step * w ** -1.5, step ** -0.5
    return {
        "use min(...), not max(...): the rate is the LOWER of the two branches": d ** -0.5 * max(decay, linear),
        "the factor d_model^-0.5 is missing": min(decay, linear),
        "the factor is d_model^-0.5 (one over the square root), not d_model^0.5": d ** 0.5 * min(decay, linear),
        "steps count from 1 in eq. 3 (step 1 is the first update); you used step + 1":
            d ** -0.5 * min((step + 1) ** -0.5, (step + 1) * w ** -1.5),
        "steps count from 1 in eq. 3 (step 1 is the first update); you used step - 1":
            d ** -0.5 * min(max(step - 1, 1e-300) ** -0.5, (step - 1) * w ** -1.5),
        "the decay branch uses step - 1; both branches take the same step, counted from 1: "
        "min(step^-0.5, step · warmup^-1.5)": d ** -0.5 * min(max(step - 1, 1e-300) ** -0.5, linear),
        "your rate is the decay branch d_model^-0.5 · step^-0.5 at every step: the warmup branch "
        "step · warmup_steps^-1.5 is missing (or has a positive exponent, which never makes it the minimum)":
            d ** -0.5 * min(decay, step * w ** 1.5),
        "the warmup branch is step · warmup_steps^-1.5; you used the exponent -0.5": d ** -0.5 * min(decay, step * w ** -0.5),
        "the decay branch is step^-0.5 (it falls after the warmup); you used step^0.5": d ** -0.5 * min(step ** 0.5, linear),
        "the decay branch is step^-0.5, the inverse square root; you used 1 / step": d ** -0.5 * min(1 / step, linear),
        "warmup_steps ** -3/2 is (warmup_steps ** -3) / 2: ** binds tighter than /, so write ** -1.5 or ** (-3 / 2)":
            d ** -0.5 * min(decay, step * w ** -3 / 2),
        "step ** -1/2 is (step ** -1) / 2: ** binds tighter than /, so write ** -0.5 or ** (-1 / 2)":
            d ** -0.5 * min(step ** -1 / 2, linear),
        "d_model ** -1/2 is (d_model ** -1) / 2: ** binds tighter than /, so write ** -0.5 or ** (-1 / 2)":
            d ** -1 / 2 * min(decay, linear),
        "the warmup branch is step · warmup_steps^-1.5, only warmup_steps raised to -1.5; you raised the product, "
        "(step * warmup_steps) ** -1.5: write step * warmup_steps ** -1.5": d ** -0.5 * min(decay, (step * w) ** -1.5),
        "d_model^-0.5 multiplies BOTH branches, the min(...) as a whole; yours multiplies only the decay branch "
        "step^-0.5": min(d ** -0.5 * decay, linear),
        "d_model^-0.5 multiplies BOTH branches, the min(...) as a whole; yours multiplies only the warmup branch "
        "step · warmup_steps^-1.5": min(decay, d ** -0.5 * linear),
    }


def noam_checks(fn) -> None:
    """`your_function(step, d_model, warmup_steps)` -> the paper's learning rate (eq. 3), steps from 1."""
    rng = fresh_random()
    drawn = (rng.randint(16, 1024), rng.randint(10, 3000))              # sizes no fixed case has
    cases = [(d_model, warmup, step) for d_model, warmup in ((512, 4000), (128, 200), drawn)
             for step in (1, 2, 10, warmup // 2, warmup - 1, warmup, warmup + 1, 4 * warmup, 10 * warmup)]
    cases.append((*drawn, rng.randint(1, 10 * drawn[1])))
    got, returned = {}, 0.0
    for d_model, warmup, step in cases:
        value = call(fn, step, d_model, warmup, on=f"step={step}, d_model={d_model}, warmup_steps={warmup}",
                     refuse=_NO_NOAM_LR,
                     hint=lambda e: ("eq. 3 counts steps from 1; step 1 must give d_model^-0.5 · warmup^-1.5 "
                                     "(did you use step - 1?)" if isinstance(e, ZeroDivisionError) else None))
        assert isinstance(value, (int, float)) or (torch.is_tensor(value) and value.numel() == 1), \
            f"return a number, got {what_it_is(value)}"
        got[d_model, warmup, step] = float(value)
        returned = value if is_number(returned) and not is_number(value) else returned   # the first non-number
    wrong_cases = [case for case in cases if not isclose(got[case], noam_lr(case[2], *case[:2]), rel_tol=1e-6)]
    if not wrong_cases:
        number_expected(returned, "noam_rate has the right values")
        return
    for message in _noam_slips(1, 1, 1):                 # a slip explains the answer at every step
        if all(isclose(got[d, w, s], _noam_slips(s, d, w)[message], rel_tol=1e-6) for d, w, s in cases):
            raise AssertionError(message)
    ratios = [got[case] / noam_lr(case[2], *case[:2]) for case in cases]
    if max(ratios) - min(ratios) < 1e-6 * abs(ratios[0]):
        raise AssertionError(f"your rate is {ratios[0]:.4g} times eq. 3 at every step: drop the extra factor, "
                             "lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)")
    said = regime(cases, [case not in wrong_cases for case in cases], lambda c: (
        "before step = warmup_steps" if c[2] < c[1] else "at step = warmup_steps" if c[2] == c[1]
        else "after step = warmup_steps"))
    if said:
        raise AssertionError(f"your rate is {said}: lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), "
                             "the linear warmup branch until step = warmup_steps, the step^-0.5 decay after it")
    d_model, warmup, step = wrong_cases[0]
    where = f"d_model={d_model}, warmup={warmup}, step={step}"
    value, expected = got[d_model, warmup, step], noam_lr(step, d_model, warmup)
    linear, decay = d_model ** -0.5 * step * warmup ** -1.5, d_model ** -0.5 * step ** -0.5
    if step < warmup and isclose(value, decay, rel_tol=1e-6):
        raise AssertionError(f"{where}: your rate is already the decay branch d_model^-0.5 · step^-0.5; "
                             f"until step = warmup_steps it is the linear warmup d_model^-0.5 · step · "
                             f"warmup^-1.5 (the two branches meet AT step = warmup_steps)")
    if step > warmup and isclose(value, linear, rel_tol=1e-6):
        raise AssertionError(f"{where}: your rate still grows linearly after the warmup; from step = "
                             f"warmup_steps on it decays as d_model^-0.5 · step^-0.5")
    raise AssertionError(f"{where}: expected {expected:.6g}, got {value:.6g}; "
                         "lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)")


_D_MODEL, _WARMUP = 128, 200          # the cooldown checker's eq. 3 (d_model ≠ warmup_steps: a swap shows)


def _ramp(progress: float, cooldown: float, shape: str) -> float:
    """The cooldown ramp (`shape` "linear", the right one) and the shapes it is usually mistaken for."""
    p, c = progress, cooldown
    return {"linear": lambda: min(1.0, max(0.0, (1 - p) / c)), "from the start": lambda: 1 - p,
            "uncapped": lambda: (1 - p) / c, "none": lambda: 1.0, "rising": lambda: min(1.0, p / c),
            "not divided": lambda: min(1.0, 1 - (p - (1 - c))),
            "rising inside": lambda: min(1.0, max(0.0, (p - (1 - c)) / c)),
            "over 1 - c": lambda: min(1.0, (1 - p) / (1 - c)), "times c": lambda: min(1.0, (1 - p) * c),
            "first share": lambda: max(0.0, min(1.0, 1 - p / c)),
            "cosine": lambda: 0.5 * (1 - math.cos(math.pi * min(1.0, max(0.0, (1 - p) / c))))}[shape]()


def _cooled_variant(case, base: tuple = ("step", "d", "w"), factor: float = 1.0, shape: str = "linear",
                    power: float = 1.0, floor: float = 0.0) -> float:
    """The reference noam_lr(step, d_model, warmup_steps) · ramp with each step a knob: `base` names the arguments
    given to noam_lr in order (a slot left out keeps its default; "w as factor" passes warmup as `factor`)."""
    cooldown, step, progress = case
    values = {"step": step, "d": _D_MODEL, "w": _WARMUP}
    rate = (noam_lr(step, _D_MODEL, 4000, _WARMUP) if base == ("w as factor",)
            else noam_lr(*(values[name] for name in base)))
    return factor * rate * (floor + (1 - floor) * _ramp(progress, cooldown, shape) ** power)


def _cooled_or_none(case, **knobs) -> float | None:
    """`_cooled_variant`, or None where a slip's variant cannot be computed for this case (0 ** a negative power,
    ...): a slip that cannot run explains nothing, and the checker must not fail on it."""
    try:
        return _cooled_variant(case, **knobs)
    except (ArithmeticError, ValueError, TypeError):
        return None


_RAMP_RULE = "min(1, (1 − progress) / cooldown): 1 until the last `cooldown` share of the run, then linearly to 0"
_COOLDOWN_SLIPS = {
    "your ramp starts at the beginning of the run; it must stay at 1 until the last `cooldown` share: "
    "min(1, (1 − progress) / cooldown)": {"shape": "from the start"},
    "cap the ramp at 1: before the cooldown the rate is eq. 3 unchanged, min(1, (1 − progress) / cooldown)":
        {"shape": "uncapped"},
    "your rate is eq. 3 unchanged; over the last `cooldown` share of the run multiply it by (1 − progress) / "
    "cooldown, which reaches 0 at the end": {"shape": "none"},
    "your ramp rises with progress; it must fall to 0 at progress 1: use 1 − progress": {"shape": "rising"},
    "you divided by 1 − cooldown; the ramp covers the last `cooldown` share of the run, so divide by cooldown: "
    "min(1, (1 − progress) / cooldown)": {"shape": "over 1 - c"},
    "you multiplied (1 − progress) by cooldown; divide by it, so that the ramp is 1 where the cooldown starts: "
    "min(1, (1 − progress) / cooldown)": {"shape": "times c"},
    "your ramp 1 − progress / cooldown falls during the FIRST `cooldown` share of the run (and stays 0 after); it "
    f"falls during the last one: {_RAMP_RULE}": {"shape": "first share"},
    f"that is a cosine ramp; the exercise's ramp falls LINEARLY to 0: {_RAMP_RULE}": {"shape": "cosine"},
    "your ramp is a square root; the exercise's ramp falls LINEARLY: min(1, (1 − progress) / cooldown)": {"power": 0.5},
    "your ramp falls by the progress made inside the cooldown, 1 − (progress − (1 − cooldown)), without dividing it "
    "by the cooldown's length, so it ends at 1 − cooldown instead of 0: divide by cooldown, which gives "
    f"{_RAMP_RULE}": {"shape": "not divided"},
    "your ramp is 0 before the cooldown and RISES to 1 at the end: it is 1 minus the right one. The rate is eq. 3 "
    f"unchanged before the cooldown, then falls to 0: {_RAMP_RULE}": {"shape": "rising inside"},
}
# noam_lr called with its arguments in other places: every order of (step, d_model, warmup_steps), one left out
# (its default), or warmup_steps given as `factor`.
_ARGUMENTS = {"step": "step", "d": "d_model", "w": "warmup_steps"}
for _order in [("step", "w", "d"), ("d", "step", "w"), ("d", "w", "step"), ("w", "step", "d"), ("w", "d", "step"),
               ("step", "d"), ("w as factor",)]:                    # noam_lr(step) alone raises: d_model is required
    _call = ("noam_lr(step, d_model, 4000, warmup_steps)" if _order == ("w as factor",) else
             f"noam_lr({', '.join(_ARGUMENTS[name] for name in _order)})")
    _COOLDOWN_SLIPS[f"the ramp is right, but your eq. 3 is {_call}: the arguments are noam_lr(step, d_model, "
                    f"warmup_steps), in that order (its 4th, `factor`, is 1)"] = {"base": _order}


def _fitted_cooldown_slips(cases: list, got: list[float]) -> dict[str, dict]:
    """Slips with a number in them, the number read from the learner's answer: a constant factor on the rate
    (from a case before the cooldown), a ramp that ends above 0 (from progress = 1), a ramp raised to a power
    (from a case inside the cooldown). name_slip then checks each on every case."""
    slips = {}
    for (cooldown, step, progress), value in zip(cases, got):
        noam, ramp = noam_lr(step, _D_MODEL, _WARMUP), _ramp(progress, cooldown, "linear")
        if ramp == 1 and "factor" not in slips and not isclose(value, noam, rel_tol=1e-9):
            k = value / noam
            slips[f"your rate is {k:.4g} times the right one at every step: drop the extra factor, "
                  f"noam_lr(step, d_model, warmup_steps) · {_RAMP_RULE}"] = {"factor": k}
        if ramp == 0 and "floor" not in slips and not isclose(value, 0.0, abs_tol=1e-15):
            a = value / noam
            slips[f"your ramp ends at {a:.4g} (the rate at progress = 1 is {a:.4g} times eq. 3), not at 0: "
                  f"{_RAMP_RULE}"] = {"floor": a}
        if 0 < ramp < 1 and "power" not in slips and value > 0 and not isclose(value, noam * ramp, rel_tol=1e-9):
            q = math.log(value / noam) / math.log(ramp)
            slips[f"your ramp falls as min(1, (1 − progress) / cooldown) to the power {q:.4g}; it falls LINEARLY: "
                  f"{_RAMP_RULE}"] = {"power": q}
    return slips


def cooldown_checks(fn) -> None:
    """`your_function(step, progress, d_model, warmup_steps, cooldown)` -> eq. 3 at `step` times the linear
    cooldown ramp min(1, (1 − progress) / cooldown) (1 before the last `cooldown` share of the run, 0 at its end)."""
    d_model, warmup = _D_MODEL, _WARMUP
    rng = fresh_random()
    drawn = round(rng.uniform(0.05, 0.95), 3)
    cases = [(cooldown, step, progress) for cooldown in (0.25, 0.5) for step, progress in (
        (1, 0.0), (150, 0.3), (300, 0.74), (310, 0.8), (350, 0.9), (400, 1.0))]
    cases += [(0.2, 320, 0.8)]                                         # the boundary: the ramp is still 1
    cases += [(0.8, 100, 0.1), (0.8, 200, 0.4)]                        # a cooldown that starts before mid-run
    cases += [(drawn, rng.randint(1, 1000), p) for p in (rng.random(), 1 - drawn / 2, 1 - drawn)]
    answers = []
    for cooldown, step, progress in cases:
        got = call(fn, step, progress, d_model, warmup, cooldown, on=f"step={step}, progress={progress}, "
                   f"d_model={d_model}, warmup_steps={warmup}, cooldown={cooldown}", refuse=_NO_COOLDOWN_FACTOR)
        assert isinstance(got, (int, float)) or (torch.is_tensor(got) and got.numel() == 1) or (
            hasattr(got, "__float__") and getattr(got, "ndim", 0) == 0), f"return a number, got {what_it_is(got)}"
        answers.append(got)
    values = [float(got) for got in answers]
    right = [isclose(value, _cooled_variant(case), rel_tol=1e-6, abs_tol=1e-12)
             for value, case in zip(values, cases)]
    if all(right):
        for (cooldown, step, progress), got in zip(cases, answers):
            number_expected(got, f"cooled_rate has the right value at step={step}, progress={progress}")
        return
    i = right.index(False)
    (cooldown, step, progress), value = cases[i], values[i]
    expected = _cooled_variant(cases[i])
    where = f"step={step}, progress={progress}, cooldown={cooldown}"
    slips = _COOLDOWN_SLIPS | _fitted_cooldown_slips(cases, values)
    same = lambda got, wrong: isclose(got, wrong, rel_tol=1e-6, abs_tol=1e-12)      # noqa: E731
    slip = name_slip(values, cases, _cooled_variant, slips, same, pairs=False)
    if slip:
        raise AssertionError(f"{where}: expected {expected:.6g}, got {value:.6g}: {slip}")
    wrong = [j for j, ok in enumerate(right) if not ok]      # a slip made only in some cases: it explains each
    slip = next((message for message, knobs in slips.items()
                 if all(_cooled_or_none(cases[j], **knobs) is not None
                        and same(values[j], _cooled_or_none(cases[j], **knobs)) for j in wrong)), None)
    if slip:
        raise AssertionError(f"{where}: expected {expected:.6g}, got {value:.6g}, right in {sum(right)} of the "
                             f"{len(cases)} cases; in the {len(wrong)} others: {slip}")
    if progress == 1.0 and not isclose(value, 0.0, abs_tol=1e-12):
        raise AssertionError(f"{where}: at the end of the run (progress = 1) the rate must be 0: the ramp "
                             "(1 − progress) / cooldown reaches 0 there")
    said = regime(cases, right, lambda c: "before the cooldown" if c[2] <= 1 - c[0] else
                  "at the end (progress = 1)" if c[2] == 1 else "during the cooldown")
    raise AssertionError(f"{where}: expected {expected:.6g}, got {value:.6g}" + (
        f"; your rate is {said}" if said else "") + "; the rate is noam_lr(step) · min(1, (1 − progress) / "
        "cooldown): eq. 3 unchanged before the last `cooldown` share, then falling linearly to 0")
