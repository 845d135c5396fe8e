"""Checkers for the coding exercises of notebook 11 (training): `check_…(your_function)`.

Hand-written, not exported (see `transformer_lib.exercises`). Each checker runs the learner's
function on small inputs and compares it with PyTorch (`F.cross_entropy`) or `transformer_lib.training`.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.exercises import Refuse, call, fresh_random, run_checker
from transformer_lib.exercises.explain import (is_number, name_difference, name_slip, number_expected, regime, what_it_is,
                                              where_wrong)
from transformer_lib.training import LabelSmoothingLoss, cooldown_factor, noam_lr
from transformer_lib.exercises.guards import allclose, assert_close, isclose

_BY_HAND = ("the exercise asks for the loss by hand, without F.cross_entropy (or nn.CrossEntropyLoss) and without "
            "LabelSmoothingLoss: build q = (1 − ε)·one_hot + ε/V and compute −Σ q · log_softmax(logits)")
_NO_CROSS_ENTROPY = [Refuse("cross_entropy", _BY_HAND), Refuse((LabelSmoothingLoss, "forward"), _BY_HAND)]
_NO_NOAM_LR = [Refuse(noam_lr, "noam_lr is the course's own eq. 3, the function this exercise asks you to write")]
_NO_COOLDOWN_FACTOR = [Refuse(cooldown_factor, "cooldown_factor is the course's own ramp, the one this exercise asks "
                              "you to write: min(1, (1 − progress) / cooldown)")]


def _close(a, b, tol=1e-5) -> bool:
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))


def _smoothed_variants(logits: torch.Tensor, target: torch.Tensor, eps: float, pad_id: int) -> dict[str, torch.Tensor]:
    """The usual slips of a hand-written label-smoothed loss, each with the message that names it."""
    N, V = logits.shape
    log_p = logits.log_softmax(-1)                                            # (N, V)
    one_hot = F.one_hot(target.clamp(min=0), V).double()                      # (N, V); a negative pad_id: class 0
    real = target != pad_id                                                   # (N,)
    q = (1 - eps) * one_hot + eps / V                                         # (N, V): PyTorch's target
    per_position = -(q * log_p).sum(-1)                                       # (N,)
    annotated = ((1 - eps) * one_hot + eps / (V - 2) * (1 - one_hot)).index_fill(1, torch.tensor([max(pad_id, 0)]), 0.0)
    entropy = -(q * q.log()).sum(-1) if eps > 0 else torch.zeros(N, dtype=log_p.dtype)
    variants = {
        "you averaged over padding positions too: keep only positions whose target is not pad_id, and divide "
        "by their number": per_position.mean(),
        "you summed the real positions' losses but divided by ALL positions, padding included: divide by the "
        "number of real (non-padding) targets": per_position[real].sum() / N,
        "you summed the losses of ALL positions, padding included, and divided by the number of real ones: leave "
        "the padding positions out of the sum too": per_position.sum() / real.sum(),
        "you summed over the positions; the loss is the MEAN over the real (non-padding) positions":
            per_position[real].sum(),
        "you averaged over the V classes too; sum q·log p over the vocabulary, then average over the positions":
            -(q * log_p).mean(-1)[real].mean(),
        "you used probabilities where the loss needs log-probabilities: −Σ q · log_softmax(logits)":
            -(q * logits.softmax(-1)).sum(-1)[real].mean(),
        "you used the logits as if they were log-probabilities: take log_softmax(logits) first, −Σ q · log p":
            -(q * logits).sum(-1)[real].mean(),
        "the log_softmax ran over the positions (dim=0); each position's distribution is over the V classes: "
        "log_softmax(logits, dim=-1)": -(q * logits.log_softmax(0)).sum(-1)[real].mean(),
        "that is KL(q ‖ p) = cross-entropy − entropy of q; the loss is the cross-entropy −Σ q log p, which "
        "F.cross_entropy(label_smoothing=ε) computes": (per_position - entropy)[real].mean(),
            "the loss uses log base 2; cross-entropy takes the natural log (log_softmax)":
            -(q * log_p / math.log(2)).sum(-1)[real].mean(),
        "ε and 1 − ε are swapped: the true token gets 1 − ε (+ ε/V), not ε":
                -((eps * one_hot + (1 - eps) / V) * log_p).sum(-1)[real].mean(),
    }
    if eps > 0:
        variants |= {
            "you spread ε over the V − 1 wrong tokens; PyTorch (and the paper's q) give ε/V to every token, the "
            "true one included: q = (1 − ε)·one_hot + ε/V":
                -(((1 - eps) * one_hot + eps / (V - 1) * (1 - one_hot)) * log_p).sum(-1)[real].mean(),
            "that is the Annotated Transformer's variant (ε/(V − 2) on the wrong tokens, 0 on the padding column); "
            "the course follows PyTorch: q = (1 − ε)·one_hot + ε/V": -(annotated * log_p).sum(-1)[real].mean(),
            "ε was not divided among the V tokens: q = (1 − ε)·one_hot + ε/V, so that q sums to 1":
                -(((1 - eps) * one_hot + eps) * log_p).sum(-1)[real].mean(),
            "you gave ε/(V − 1) to every token, the true one included, so q sums to more than 1; q = (1 − ε)·one_hot "
            "+ ε/V": -(((1 - eps) * one_hot + eps / (V - 1)) * log_p).sum(-1)[real].mean(),
            "the true token got 1 − ε only; it gets ε/V too, like every token: q = (1 − ε)·one_hot + ε/V":
                -(((1 - eps) * one_hot + eps / V * (1 - one_hot)) * log_p).sum(-1)[real].mean(),
            "the smoothing part is missing: you weighted −log p(true token) by 1 − ε, but q also puts ε/V on "
            "every token: q = (1 − ε)·one_hot + ε/V": -((1 - eps) * one_hot * log_p).sum(-1)[real].mean(),
            "your loss ignores ε: it is the plain cross-entropy; mix the one-hot target with the uniform one, "
            "q = (1 − ε)·one_hot + ε/V": -(one_hot * log_p).sum(-1)[real].mean(),
            "the true token's weight is 1 − ε, not 1: q = one_hot + ε/V sums to 1 + ε; q = (1 − ε)·one_hot + ε/V":
                -((one_hot + eps / V) * log_p).sum(-1)[real].mean(),
            "the smoothing term must be multiplied by ε: q = (1 − ε)·one_hot + ε/V, not (1 − ε)·one_hot + 1/V":
                -(((1 - eps) * one_hot + 1 / V) * log_p).sum(-1)[real].mean(),
        }
    return variants


def _smoothing_cases() -> list[tuple[torch.Tensor, torch.Tensor, float, int, str]]:
    """(logits, target, eps, pad_id, what): fixed ones for each rule, then one drawn afresh."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 7, generator=generator)
    target = torch.randint(1, 7, (12,), generator=generator)
    target[::3] = 0                                            # a third of the positions are padding (id 0)
    other_pad = target.clone()
    other_pad[1::4] = 3                                        # pad_id 3; id 0 is now a real token
    rng = fresh_random()
    N, V = rng.randint(5, 20), rng.randint(3, 12)
    drawn = torch.tensor([rng.randrange(V) for _ in range(N)])
    pad = rng.randrange(V)
    drawn[0] = (pad + 1) % V                                   # at least one real position
    return [(logits, target, eps, 0, "logits (N=12, V=7), target (N,) with 4 padding positions") for eps in (0.0, 0.1, 0.4)] + [
        (logits, other_pad, 0.2, 3, "pad_id=3 (and 0 a real token)"),
        (500 + logits, target, 0.1, 0, "large logits, around 500"),
        (60 * logits, target, 0.1, 0, "saturated logits (60 × randn: some probabilities are below 1e-40)"),
        (logits, target.masked_fill(target == 0, -100), 0.1, -100, "pad_id=-100 (PyTorch's default ignore_index; "
         "a negative id that is no class)"),
        (3 * torch.randn(N, V, generator=generator), drawn, round(rng.random() * 0.5, 3), pad, f"N={N}, V={V}")]


def check_label_smoothing(your_function) -> None:
    """`your_function(logits (N, V), target (N,), eps, pad_id)` -> the label-smoothed loss, a scalar."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def _check(fn):
        for logits, target, eps, pad, what in _smoothing_cases():
            expected = F.cross_entropy(logits.double(), target, ignore_index=pad, label_smoothing=eps)
            got = call(fn, logits, target, eps, pad, on=f"{what}, eps={eps}, pad_id={pad}", refuse=_NO_CROSS_ENTROPY,
                       hint=lambda e: (f"pad_id={pad} is not a class, so one_hot (or an index) of the padding targets "
                                       "fails: leave the padding positions out first, or replace their target by any "
                                       "class (target.masked_fill(target == pad_id, 0)) since they are dropped anyway"
                                       if pad < 0 else None))
            assert isinstance(got, torch.Tensor) and got.dim() == 0, "return the loss as a scalar tensor (0 dimensions)"
            if _close(got, expected):
                continue
            if got.isnan():
                raise AssertionError(f"NaN for {what}: exp of a large logit overflows (inf / inf). Use log_softmax, "
                                     "which subtracts the row's max, instead of exp(logits) / sum")
            if got.isinf():
                raise AssertionError(f"inf for {what}: a probability underflowed to 0 and log(0) = −inf. Use "
                                     "log_softmax(logits, dim=-1) instead of softmax(...).log()")
            if pad != 0 and _close(got, F.cross_entropy(logits.double(), target, ignore_index=0, label_smoothing=eps)):
                raise AssertionError(f"with pad_id={pad} you left out the positions whose target is 0: compare with "
                                     "the pad_id argument, target != pad_id, not with a fixed 0")
            variants = _smoothed_variants(logits.double(), target, eps, pad)
            for message, wrong in variants.items():
                if _close(got, wrong) and not _close(wrong, expected):
                    raise AssertionError(f"ε = {eps}: {message}")
            for message, wrong in {"": expected, **variants}.items():
                if _close(-got, wrong) and not _close(wrong, -expected):
                    raise AssertionError(f"for {what}, ε = {eps}: your loss is {float(got):.5f}, the NEGATIVE of "
                                         f"{float(-got):.5f}: the loss is −Σ q_i log p_i (log p ≤ 0, so the loss is "
                                         "≥ 0); keep the minus sign" + (f". And besides: {message}" if message else ""))
            cases = _smoothing_cases()
            said = where_wrong([_right_on(fn, *case) for case in cases], cases, {
                "with ε = 0": lambda c: c[2] == 0, "with ε > 0": lambda c: c[2] > 0,
                "with pad_id 0": lambda c: c[3] == 0, "with a pad_id other than 0": lambda c: c[3] != 0,
                "with a negative pad_id": lambda c: c[3] < 0, "for large logits": lambda c: c[0].abs().max() > 100})
            if said:
                raise AssertionError(f"for {what}, ε = {eps}: your loss is {said}: q = (1 − ε)·one_hot + ε/V, −Σ q · log_softmax(logits) at "
                                     "every position, averaged over the positions whose target is not pad_id")
            raise AssertionError(f"for {what}, ε = {eps}, your loss is {float(got):.5f}, F.cross_entropy(logits, "
                                 f"target, ignore_index=pad_id, label_smoothing=ε) gives {float(expected):.5f}"
                                 + (" (even without smoothing: the mean of −log p(true token))" if eps == 0 else ""))
    run_checker("label smoothing by hand", your_function, _check)


def _right_on(fn, logits, target, eps, pad, what) -> bool:
    """Whether the learner's loss is right on one case (an exception counts as wrong)."""
    try:
        got = fn(logits, target, eps, pad)
        return _close(got, F.cross_entropy(logits.double(), target, ignore_index=pad, label_smoothing=eps))
    except Exception:
        return False


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
    }


def check_noam_lr(your_function) -> None:
    """`your_function(step, d_model, warmup_steps)` -> the paper's learning rate (eq. 3), steps from 1."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def _check(fn):
        rng = fresh_random()
        drawn = (rng.randint(16, 1024), rng.randint(10, 3000))              # sizes no fixed case has
        cases = [(d_model, warmup, step) for d_model, warmup in ((512, 4000), (128, 200), drawn)
                 for step in (1, 2, 10, warmup // 2, warmup - 1, warmup, warmup + 1, 4 * warmup)]
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
    run_checker("the Noam learning rate", your_function, _check)


class _CountingLinear(nn.Module):
    """nn.Linear that remembers the largest batch it saw, to check that micro-batches stay apart."""

    def __init__(self, d_in: int, v: int):
        super().__init__()
        self.linear, self.largest = nn.Linear(d_in, v), 0

    def forward(self, x):
        self.largest = max(self.largest, x.size(0))
        return self.linear(x)


def _micro_batch_cases() -> list[tuple[list, int]]:
    """(micro_batches, pad_id): different numbers of real targets; then pad_id 3 with 0 a real target; then fresh."""
    generator = torch.Generator().manual_seed(0)
    cases = []
    for sizes, pad in ((((6, 0), (10, 7), (4, 1)), 0), (((5, 1), (8, 6)), 3)):
        micro_batches = []
        for n, n_pad in sizes:
            x = torch.randn(n, 5, generator=generator)
            y = torch.randint(0, 9, (n,), generator=generator).masked_fill_(torch.arange(n) < n_pad, pad)
            y[n_pad:] = torch.where(y[n_pad:] == pad, (pad + 1) % 9, y[n_pad:])
            y[n_pad] = 0 if pad else y[n_pad]                      # with pad_id 3, a real target 0
            micro_batches.append((x, y))
        cases.append((micro_batches, pad))
    rng = fresh_random()
    pad, micro_batches = rng.randrange(9), []
    for _ in range(rng.randint(2, 5)):
        n = rng.randint(1, 9)
        y = torch.tensor([pad if rng.random() < 0.4 else rng.choice([v for v in range(9) if v != pad]) for _ in range(n)])
        y[0] = (pad + 1) % 9                                      # every micro-batch has a real target
        micro_batches.append((torch.randn(n, 5, generator=generator), y))
    return cases + [(micro_batches, pad)]


def _grad_with(state: dict, criterion, micro_batches: list, weights: list[float] | None) -> torch.Tensor:
    """The weight's gradient after backward() on each micro-batch's loss times its weight (None: all at once)."""
    model = _CountingLinear(5, 9)
    model.load_state_dict(state)
    if weights is None:
        criterion(model(torch.cat([x for x, _ in micro_batches])), torch.cat([y for _, y in micro_batches])).backward()
    for (x, y), weight in zip(micro_batches, weights or []):
        (criterion(model(x), y) * weight).backward()
    return model.linear.weight.grad


def _check_accumulation_on(fn, micro_batches: list, pad: int) -> None:
    criterion = LabelSmoothingLoss(0.1, ignore_index=pad)
    model = _CountingLinear(5, 9)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    sizes = [len(y) for _, y in micro_batches]
    call(fn, model, criterion, micro_batches, pad, on=f"{len(sizes)} micro-batches of {sizes} examples "
         f"({[int((y == pad).sum()) for _, y in micro_batches]} of them padding, pad_id={pad}) and a linear model")
    assert model.largest <= max(sizes), ("run the model on one micro-batch at a time, not on all of them "
                                         "concatenated: that is the point of accumulating")
    grad, expected = model.linear.weight.grad, _grad_with(state, criterion, micro_batches, None)
    assert grad is not None, ("no gradient left in .grad: call backward() on each micro-batch's loss, and do not "
                              "zero the gradients (or set them to None) after the last one")
    if allclose(grad, expected, atol=1e-6, rtol=1e-5):
        return
    real = [int((y != pad).sum()) for _, y in micro_batches]
    not_zero = [int((y != 0).sum()) for _, y in micro_batches]
    k = len(micro_batches)
    slips = [
        ([1.0] * k, "you called backward() on each micro-batch's loss as it is, so the gradients add up to the SUM of "
                    "the micro-batch means; scale each loss by its share of the real targets, n_i / n_total"),
        ([1 / k] * k, "you weighted every micro-batch equally; the loss is a mean over real target tokens, so weight "
                      "each micro-batch by its share of them: n_i / n_total"),
        ([n / sum(not_zero) for n in not_zero], f"you counted the targets that are not 0; count those that are not "
         f"pad_id (here {pad}): (target != pad_id).sum()"),
        ([n / k for n in real], "you weighted each micro-batch by its count of real targets divided by the number "
         "of micro-batches; divide by the TOTAL count of real targets instead: n_i / n_total"),
        ([1 / n for n in real], "you divided each micro-batch's loss (already a mean) by its count of real targets; "
         "weight it by that count over the total: loss_i · n_i / n_total"),
        ([float(n) for n in real], f"you multiplied each micro-batch's loss by its count of real targets n_i but "
         f"did not divide by the total count (here {sum(real)}): loss_i · n_i / n_total"),
        ([len(y) / sum(sizes) for _, y in micro_batches], "you weighted each micro-batch by its number of examples, "
         "padding included; the loss is a mean over REAL target tokens: weight by the count of targets != pad_id"),
    ]
    for weights, message in slips:
        wrong = _grad_with(state, criterion, micro_batches, weights)
        if allclose(grad, wrong, atol=1e-6, rtol=1e-5) and not allclose(wrong, expected, atol=1e-6):
            raise AssertionError(message)
    if allclose(grad, expected * k, atol=1e-6):
        raise AssertionError(f"the gradient is {k} times too big: scale each micro-batch's loss")
    for i in range(k):
        g_one = _grad_with(state, criterion, micro_batches[i:i + 1], [1.0])
        scale = float((grad * g_one).sum() / (g_one * g_one).sum())             # grad = scale · (this one's)?
        if allclose(grad, scale * g_one, atol=1e-6) and not allclose(expected, scale * g_one, atol=1e-6):
            raise AssertionError(("only the last micro-batch's gradient is left: do not zero the gradients (or step "
                                  "the optimizer) between micro-batches; backward() adds into .grad") if i == k - 1 else
                                 f"only micro-batch {i}'s gradient is there: run forward and backward on every "
                                 "micro-batch, one after the other")
    if not grad.any():
        raise AssertionError("every gradient is 0: did you zero them (zero_grad) after the last backward()? "
                             "Leave the accumulated gradients in .grad")
    name_difference(grad, expected, f"the gradient (pad_id={pad}): ", "; the loss of all micro-batches together "
                    "weights each by its share of the real targets")
    assert_close(grad, expected, atol=1e-6, rtol=1e-5, msg=lambda m: (
        f"the accumulated gradient differs from one pass over all micro-batches together (pad_id={pad}):\n" + m))


def check_gradient_accumulation(your_function) -> None:
    """`your_function(model, criterion, micro_batches, pad_id)` leaves in `.grad` the gradient of the
    loss over all micro-batches together, running one micro-batch at a time."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def _check(fn):
        for micro_batches, pad in _micro_batch_cases():
            _check_accumulation_on(fn, micro_batches, pad)
    run_checker("gradient accumulation", your_function, _check)


_D_MODEL, _WARMUP = 128, 200          # the cooldown checker's eq. 3 (d_model ≠ warmup_steps: a swap shows)


def _ramp(progress: float, cooldown: float, shape: str) -> float:
    """The cooldown ramp (`shape` "linear", the right one) and the shapes it is usually mistaken for."""
    p, c = progress, cooldown
    return {"linear": lambda: min(1.0, max(0.0, (1 - p) / c)), "from the start": lambda: 1 - p,
            "uncapped": lambda: (1 - p) / c, "none": lambda: 1.0, "rising": lambda: min(1.0, p / c),
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
}
# noam_lr called with its arguments in other places: every order of (step, d_model, warmup_steps), one left out
# (its default), or warmup_steps given as `factor`.
_ARGUMENTS = {"step": "step", "d": "d_model", "w": "warmup_steps"}
for _order in [("step", "w", "d"), ("d", "step", "w"), ("d", "w", "step"), ("w", "step", "d"), ("w", "d", "step"),
               ("step", "d"), ("step",), ("w as factor",)]:
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


def check_cooldown(your_function) -> None:
    """`your_function(step, progress, d_model, warmup_steps, cooldown)` -> eq. 3 at `step` times the linear
    cooldown ramp min(1, (1 − progress) / cooldown) (1 before the last `cooldown` share of the run, 0 at its end)."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def _check(fn):
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
                     if all(same(values[j], _cooled_variant(cases[j], **knobs)) for j in wrong)), None)
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
    run_checker("the cooldown", your_function, _check)
