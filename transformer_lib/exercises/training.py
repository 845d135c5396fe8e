"""Checkers for the coding exercises of notebook 11 (training): `check_…(your_function)`.

Hand-written, not exported (see `transformer_lib.exercises`). Each checker runs the learner's function on small
inputs and compares it with PyTorch (`F.cross_entropy`) or `transformer_lib.training`. The label-smoothed loss and
gradient accumulation are checked here; the learning-rate exercises (the Noam rate, its cooldown) are checked by
`transformer_lib.exercises.schedule`, whose checks the `check_…` functions below run.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.exercises import Refuse, call, fresh_random, run_checker
from transformer_lib.exercises.explain import name_difference, where_wrong
from transformer_lib.exercises.guards import allclose, assert_close
from transformer_lib.exercises.schedule import cooldown_checks, noam_checks
from transformer_lib.training import LabelSmoothingLoss

_BY_HAND = ("the exercise asks for the loss by hand, without F.cross_entropy (or nn.CrossEntropyLoss) and without "
            "LabelSmoothingLoss: build q = (1 − ε)·one_hot + ε/V and compute −Σ q · log_softmax(logits)")
_NO_CROSS_ENTROPY = [Refuse("cross_entropy", _BY_HAND), Refuse((LabelSmoothingLoss, "forward"), _BY_HAND)]


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
        ([1 / sum(real)] * k, f"you divided each micro-batch's loss by the total count of real targets (here "
         f"{sum(real)}) but did not multiply it by its own count n_i: each loss is already a mean over its n_i real "
         "targets, so weight it by n_i / n_total"),
        ([1 / sum(sizes)] * k, f"you divided each micro-batch's loss by the total number of examples (here {sum(sizes)}, "
         "padding included) and did not multiply it by its own count: weight each loss by n_i / n_total, n counting "
         "the targets != pad_id"),
        ([n / sum(real) / k for n in real], "you weighted each micro-batch by n_i / n_total and then divided by the "
         "number of micro-batches too: n_i / n_total already sums to 1 over the micro-batches"),
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
    weights = _fitted_weights(grad, state, criterion, micro_batches)
    if weights is not None:
        right = ", ".join(f"{n}/{sum(real)}" for n in real)
        raise AssertionError(f"your gradient is the sum of the micro-batches' gradients weighted by "
                             f"[{', '.join(f'{w:.4g}' for w in weights)}] (pad_id={pad}, {real} real targets per "
                             f"micro-batch); the right weights are n_i / n_total = [{right}]: multiply each "
                             "micro-batch's mean loss by its count of targets != pad_id over the total count")
    name_difference(grad, expected, f"the gradient (pad_id={pad}): ", "; the loss of all micro-batches together "
                    "weights each by its share of the real targets")
    assert_close(grad, expected, atol=1e-6, rtol=1e-5, msg=lambda m: (
        f"the accumulated gradient differs from one pass over all micro-batches together (pad_id={pad}):\n" + m))


def _fitted_weights(grad: torch.Tensor, state: dict, criterion, micro_batches: list) -> list[float] | None:
    """The weights w_i with grad = Σ w_i · (gradient of micro-batch i's loss), if some make it exactly so (a
    wrong weighting of the micro-batches, whatever the formula), else None."""
    columns = torch.stack([_grad_with(state, criterion, micro_batches[i:i + 1], [1.0]).flatten().double()
                           for i in range(len(micro_batches))], dim=1)             # (numel, k)
    weights = torch.linalg.lstsq(columns, grad.flatten().double()[:, None]).solution.flatten()
    if allclose((columns @ weights).float(), grad.flatten(), atol=1e-6, rtol=1e-5):
        return weights.tolist()
    return None


def check_gradient_accumulation(your_function) -> None:
    """`your_function(model, criterion, micro_batches, pad_id)` leaves in `.grad` the gradient of the
    loss over all micro-batches together, running one micro-batch at a time."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def _check(fn):
        for micro_batches, pad in _micro_batch_cases():
            _check_accumulation_on(fn, micro_batches, pad)
    run_checker("gradient accumulation", your_function, _check)


def check_noam_lr(your_function) -> None:
    """`your_function(step, d_model, warmup_steps)` -> the paper's learning rate (eq. 3), steps from 1."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("the Noam learning rate", your_function, noam_checks)


def check_cooldown(your_function) -> None:
    """`your_function(step, progress, d_model, warmup_steps, cooldown)` -> eq. 3 at `step` times the linear
    cooldown ramp min(1, (1 − progress) / cooldown) (1 before the last `cooldown` share of the run, 0 at its end)."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("the cooldown", your_function, cooldown_checks)
