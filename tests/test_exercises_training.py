"""The checkers of notebook 11's coding exercises: plausible mistakes
raise AssertionError with a message that says what is wrong, right answers (several ways of writing them) pass.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.exercises.training import (check_cooldown, check_gradient_accumulation, check_label_smoothing,
                                               check_noam_lr)
from transformer_lib.training import LabelSmoothingLoss, cooldown_factor, noam_lr


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



# ---------------------------------------------------------------- label smoothing
def smoothed(logits, target, eps, pad_id, spread_over=None, keep_padding=False):
    V = logits.size(-1)
    log_p = logits.log_softmax(-1)
    one_hot = F.one_hot(target.masked_fill(target == pad_id, 0), V).float()   # pad_id may be negative (-100)
    q = (1 - eps) * one_hot + eps / V if spread_over is None else (1 - eps) * one_hot + eps * (1 - one_hot) / spread_over
    loss = -(q * log_p).sum(-1)
    return loss.mean() if keep_padding else loss[target != pad_id].mean()


def smoothed_by_parts(logits, target, eps, pad_id):
    """Another right answer: (1 − ε)·NLL + ε·mean(−log p), float64, a loop over the real positions."""
    log_p = torch.log_softmax(logits.double(), dim=1)
    losses = [(1 - eps) * -log_p[n, target[n]] + eps * -log_p[n].mean()
              for n in range(len(target)) if target[n] != pad_id]
    return torch.stack(losses).mean().float()


def smoothed_kl(logits, target, eps, pad_id):
    """KL(q || p) = cross-entropy − entropy(q): what nn.KLDivLoss would give."""
    V = logits.size(-1)
    q = (1 - eps) * F.one_hot(target, V).float() + eps / V
    kl = (q * (q.clamp(min=1e-12).log() - logits.log_softmax(-1))).sum(-1)
    return kl[target != pad_id].mean()


def smoothed_annotated(logits, target, eps, pad_id):
    """The Annotated Transformer's target: ε/(V − 2) on the wrong tokens, 0 on the padding column."""
    V = logits.size(-1)
    q = torch.full_like(logits, eps / (V - 2))
    q.scatter_(1, target[:, None], 1 - eps)
    q[:, pad_id] = 0
    return -(q * logits.log_softmax(-1)).sum(-1)[target != pad_id].mean()


def smoothed_q(logits, target, eps, pad_id, q_of, reduce="mean", log=True):
    V = logits.size(-1)
    one_hot = F.one_hot(target, V).float()
    p = logits.log_softmax(-1) if log else logits.softmax(-1)
    loss = -(q_of(one_hot, eps, V) * p).sum(-1)
    real = target != pad_id
    return {"mean": loss[real].mean(), "sum": loss[real].sum(), "all": loss[real].sum() / len(target)}[reduce]


RIGHT_Q = staticmethod(lambda one_hot, eps, V: (1 - eps) * one_hot + eps / V)


def smoothed_logsumexp(logits, target, eps, pad_id):
    """Another right answer: log p = logits − logsumexp, q built with scatter, a boolean index for the mean."""
    log_p = logits - logits.logsumexp(dim=1, keepdim=True)
    keep = target != pad_id
    q = torch.full_like(logits, eps / logits.size(1)).scatter_add(
        1, target.where(keep, 0)[:, None], torch.full((len(target), 1), 1 - eps))
    return (-(q * log_p).sum(1) * keep).sum() / keep.sum()


@pytest.mark.parametrize("right", [smoothed, smoothed_by_parts, smoothed_logsumexp])
def test_label_smoothing_right_answers(right):
    assert accepted(check_label_smoothing, right)


def in_place_logits(lg, t, eps, pad):
    lg.sub_(lg.max())
    return smoothed(lg, t, eps, pad)


@pytest.mark.parametrize("wrong,message", [
    (lambda lg, t, eps, pad: smoothed(lg, t, eps, pad, keep_padding=True), "averaged over padding"),
    (lambda lg, t, eps, pad: smoothed(lg, t, eps, pad, spread_over=lg.size(-1) - 1), "V − 1 wrong tokens"),
    (lambda lg, t, eps, pad: smoothed(lg, t, 0.0, pad), "ignores ε"),
    (lambda lg, t, eps, pad: smoothed(lg, t, eps, pad).item(), "scalar tensor"),
    (smoothed_kl, "KL"),
    (smoothed_annotated, "Annotated Transformer"),
    (lambda lg, t, eps, pad: smoothed_q(lg, t, eps, pad, lambda o, e, V: (1 - e) * o + e), "not divided among the V"),
    (lambda lg, t, eps, pad: smoothed_q(lg, t, eps, pad, lambda o, e, V: (1 - e) * o), "smoothing part is missing"),
    (lambda lg, t, eps, pad: smoothed_q(lg, t, eps, pad, lambda o, e, V: e * o + (1 - e) / V), "swapped"),
    (lambda lg, t, eps, pad: smoothed_q(lg, t, eps, pad, RIGHT_Q.__func__, reduce="sum"), "summed over the positions"),
    (lambda lg, t, eps, pad: smoothed_q(lg, t, eps, pad, RIGHT_Q.__func__, reduce="all"), "divided by ALL positions"),
    (lambda lg, t, eps, pad: smoothed_q(lg, t, eps, pad, RIGHT_Q.__func__, log=False), "log-probabilities"),
    (lambda lg, t, eps, pad: -(((1 - eps) * F.one_hot(t, lg.size(-1)) + eps / lg.size(-1)) * lg.log_softmax(-1))
     .mean(-1)[t != pad].mean(), "averaged over the V classes"),
    (in_place_logits, "changed its input `lg` in place"),
    (lambda lg, t, eps, pad: smoothed(lg, t[:, None], eps, pad), "raised IndexError"),
    (lambda lg, t, eps, pad: 1.01 * smoothed(lg, t, eps, pad), "F.cross_entropy"),
])
def test_label_smoothing_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_label_smoothing(wrong)


# ---------------------------------------------------------------- Noam learning rate
def noam_branches(step, d, w, switch=None):
    switch = w if switch is None else switch
    return d ** -0.5 * (step * w ** -1.5 if step <= switch else step ** -0.5)


@pytest.mark.parametrize("right", [
    lambda step, d, w: d ** -0.5 * min(step ** -0.5, step * w ** -1.5),
    noam_branches,
    lambda step, d, w: noam_branches(step, d, w, switch=w - 1),     # the branches meet at w: either side is right
    lambda step, d, w: (torch.tensor(float(d)).rsqrt() * torch.minimum(torch.tensor(step ** -0.5),
                                                                      torch.tensor(step / w ** 1.5))).item(),
    lambda step, d, w: 1 / math.sqrt(d) * (step * w ** -1.5 if step < w else 1 / math.sqrt(step)),
])
def test_noam_right_answers(right):
    assert accepted(check_noam_lr, right)


@pytest.mark.parametrize("wrong,message", [
    (lambda step, d, w: d ** -0.5 * max(step ** -0.5, step * w ** -1.5), "not max"),
    (lambda step, d, w: min(step ** -0.5, step * w ** -1.5), "d_model\\^-0.5 is missing"),
    (lambda step, d, w: d ** -0.5 * min(step ** -0.5, step * w ** -0.5), "exponent -0.5"),
    # `if step < warmup - 1:` the warmup branch, else the decay: the switch one step early
    (lambda step, d, w: noam_branches(step, d, w, switch=w - 2), "step=3999: your rate is already the decay branch"),
    (lambda step, d, w: noam_branches(step, d, w, switch=w + 1), "step=4001: your rate still grows linearly"),
    (lambda step, d, w: noam_branches(step, d, w, switch=w // 2), "already the decay branch"),
    (lambda step, d, w: d ** -0.5 * min((step + 1) ** -0.5, (step + 1) * w ** -1.5), "you used step \\+ 1"),
    (lambda step, d, w: d ** -0.5 * min((step - 1) ** -0.5, (step - 1) * w ** -1.5), "raised ZeroDivisionError.*step - 1"),
    (lambda step, d, w: d ** 0.5 * min(step ** -0.5, step * w ** -1.5), "d_model\\^0.5"),
    (lambda step, d, w: d ** -0.5 * min(step ** -0.5, step * w ** 1.5), "warmup branch step · warmup_steps\\^-1.5 is missing \\(or has a positive exponent"),
    (lambda step, d, w: d ** -0.5 * min(step ** 0.5, step * w ** -1.5), "step\\^0.5"),
    (lambda step, d, w: [noam_branches(step, d, w)], "return a number"),
    (lambda step, d, w: torch.tensor(float(d)).rsqrt() * torch.minimum(torch.tensor(step ** -0.5),
                                                                       torch.tensor(step / w ** 1.5)),
     r"right values: return a number \(int or float\).*a tensor of shape \(\).*\.item\(\)"),
    (lambda step, d, w: 3 * noam_branches(step, d, w), "3 times eq. 3 at every step"),
])
def test_noam_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_noam_lr(wrong)


# ---------------------------------------------------------------- gradient accumulation
def accumulate(model, criterion, micro_batches, pad_id):
    total = sum(int((y != pad_id).sum()) for _, y in micro_batches)
    for x, y in micro_batches:
        (criterion(model(x), y) * int((y != pad_id).sum()) / total).backward()


def equal_weights(model, criterion, micro_batches, pad_id):
    for x, y in micro_batches:
        (criterion(model(x), y) / len(micro_batches)).backward()


def no_scaling(model, criterion, micro_batches, pad_id):
    for x, y in micro_batches:
        criterion(model(x), y).backward()


def all_at_once(model, criterion, micro_batches, pad_id):
    criterion(model(torch.cat([x for x, _ in micro_batches])), torch.cat([y for _, y in micro_batches])).backward()


def accumulate_with_sum_loss(model, criterion, micro_batches, pad_id):
    """Another right answer: sum the per-token losses, divide once by the total at the end."""
    total = sum(int((y != pad_id).sum()) for _, y in micro_batches)
    for x, y in micro_batches:
        n = (y != pad_id).sum()
        (criterion(model(x), y) * n).div(total).backward()


def zero_each_time(model, criterion, micro_batches, pad_id):
    total = sum(int((y != pad_id).sum()) for _, y in micro_batches)
    for x, y in micro_batches:
        model.zero_grad()
        (criterion(model(x), y) * int((y != pad_id).sum()) / total).backward()


def weights_with_padding(model, criterion, micro_batches, pad_id):
    total = sum(y.numel() for _, y in micro_batches)
    for x, y in micro_batches:
        (criterion(model(x), y) * y.numel() / total).backward()


@pytest.mark.parametrize("right", [accumulate, accumulate_with_sum_loss])
def test_gradient_accumulation_right_answers(right):
    assert accepted(check_gradient_accumulation, right)


@pytest.mark.parametrize("wrong,message", [
    (zero_each_time, "only the last micro-batch's gradient"),
    (weights_with_padding, "padding included"),
    (lambda model, criterion, micro_batches, pad_id: criterion(model(micro_batches), 0), "raised"),
    (equal_weights, "weighted every micro-batch equally"),
    (no_scaling, "SUM of the micro-batch means|times too big"),
    (all_at_once, "one micro-batch at a time"),
    (lambda model, criterion, micro_batches, pad_id: None, "no gradient"),
])
def test_gradient_accumulation_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_gradient_accumulation(wrong)


# ---------------------------------------------------------------- the cooldown
def cooled(step, progress, d_model, warmup, cooldown):
    return noam_lr(step, d_model, warmup) * min(1.0, (1 - progress) / cooldown)


@pytest.mark.parametrize("right", [
    cooled, lambda step, p, d, w, c: noam_lr(step, d, w) * (1.0 if p <= 1 - c else (1 - p) / c),
])
def test_cooldown_right_answers(right):
    assert accepted(check_cooldown, right)


def test_cooldown_stub_is_not_attempted(capsys):
    def stub(step, progress, d_model, warmup, cooldown):
        raise NotImplementedError
    assert check_cooldown(stub) is None
    assert "the cooldown: not attempted yet" in capsys.readouterr().out


def test_a_crash_in_the_cooldown_is_named():
    with pytest.raises(AssertionError, match="raised ZeroDivisionError .* progress=0.0, d_model=128"):
        check_cooldown(lambda step, p, d, w, c: noam_lr(step, d, w) * min(1.0, (1 - p) / (c * p)))


@pytest.mark.parametrize("wrong,message", [
    (lambda step, p, d, w, c: noam_lr(step, d, w) * (1 - p), "starts at the beginning of the run"),
    (lambda step, p, d, w, c: noam_lr(step, d, w) * (1 - p) / c, "cap the ramp at 1"),
    (lambda step, p, d, w, c: noam_lr(step, d, w) * min(1.0, p / c), "rises with progress"),
    (lambda step, p, d, w, c: noam_lr(step, d, w), "eq. 3 unchanged"),
    (lambda step, p, d, w, c: noam_lr(step, d, w) * min(1.0, (1 - p) / c) ** 2, "progress=0.8, cooldown=0.25: expected"),
    (lambda step, p, d, w, c: [cooled(step, p, d, w, c)], "return a number"),
])
def test_cooldown_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_cooldown(wrong)


# ---------------------------------------------------------------- what the issue found, and more slips
def smoothed_exp_by_hand(logits, target, eps, pad_id):
    """Overflows: exp(500) is inf in float32."""
    p = logits.exp() / logits.exp().sum(-1, keepdim=True)
    return smoothed_q(p.log(), target, eps, pad_id, RIGHT_Q.__func__)


def smoothed_softmax_log(logits, target, eps, pad_id):
    """Underflows: softmax then log gives log(0) = -inf for saturated logits."""
    V = logits.size(-1)
    q = (1 - eps) * F.one_hot(target, V).float() + eps / V
    return -(q * logits.softmax(-1).log()).sum(-1)[target != pad_id].mean()


@pytest.mark.parametrize("wrong,message", [
    (lambda lg, t, eps, pad: F.cross_entropy(lg, t, ignore_index=pad, label_smoothing=eps), "without F.cross_entropy"),
    (lambda lg, t, eps, pad: LabelSmoothingLoss(eps, ignore_index=pad)(lg, t), "without LabelSmoothingLoss"),
    (lambda lg, t, eps, pad: torch.nn.CrossEntropyLoss(ignore_index=pad, label_smoothing=eps)(lg, t), "by hand"),
    (lambda lg, t, eps, pad: smoothed(lg, t, eps, 0), "compare with the pad_id argument"),
    (smoothed_exp_by_hand, "NaN for large logits.*log_softmax"),
    (smoothed_softmax_log, "inf for saturated logits.*log_softmax"),
    (lambda lg, t, eps, pad: -((((1 - eps) * F.one_hot(t, lg.size(-1)) + eps / lg.size(-1)) * lg).sum(-1))[t != pad].mean(),
     "logits as if they were log-probabilities"),
    (lambda lg, t, eps, pad: -((((1 - eps) * F.one_hot(t, lg.size(-1)) + eps / lg.size(-1)) * lg.log_softmax(0))
                              .sum(-1))[t != pad].mean(), "dim=0"),
])
def test_label_smoothing_more_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_label_smoothing(wrong)


def noam_memorised(step, d, w):
    table = {(512, 4000): {}, (128, 200): {}}
    for (dd, ww), row in table.items():
        for s in (1, 2, 10, ww // 2, ww - 1, ww, ww + 1, 4 * ww):
            row[s] = dd ** -0.5 * min(s ** -0.5, s * ww ** -1.5)
    return table.get((d, w), {}).get(step, 0.0)


@pytest.mark.parametrize("wrong,message", [
    (lambda step, d, w: noam_lr(step, d, w), "noam_lr is the course's own eq. 3"),
    (lambda step, d, w: d ** -0.5 * min((step - 1) ** -0.5 if step > 1 else float("inf"), step * w ** -1.5),
     "decay branch uses step - 1"),
    (noam_memorised, "expected"),
])
def test_noam_more_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_noam_lr(wrong)


def counts_zeros(model, criterion, micro_batches, pad_id):
    total = sum(int((y != 0).sum()) for _, y in micro_batches)
    for x, y in micro_batches:
        (criterion(model(x), y) * int((y != 0).sum()) / total).backward()


def steps_an_optimizer(model, criterion, micro_batches, pad_id):
    accumulate(model, criterion, micro_batches, pad_id)
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad


def accumulate_masks(model, criterion, micro_batches, pad_id):
    """Another right answer: the real-target counts as tensors, the total computed first with a mask."""
    masks = [y.ne(pad_id) for _, y in micro_batches]
    total = torch.stack([m.sum() for m in masks]).sum()
    for (x, y), m in zip(micro_batches, masks):
        criterion(model(x), y).mul(m.sum() / total).backward()


@pytest.mark.parametrize("wrong,message", [
    (no_scaling, "SUM of the micro-batch means"),
    (counts_zeros, "count those that are not pad_id"),
    (steps_an_optimizer, "changed its input `model` in place"),
])
def test_gradient_accumulation_more_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_gradient_accumulation(wrong)


def test_gradient_accumulation_more_right_answers():
    assert accepted(check_gradient_accumulation, accumulate_masks)


@pytest.mark.parametrize("wrong,message", [
    (lambda step, p, d, w, c: noam_lr(step, d, w) * cooldown_factor(p, c), "cooldown_factor is the course's own ramp"),
    (lambda step, p, d, w, c: noam_lr(step, d, w) * min(1.0, (1 - p) / (1 - c)), "divided by 1 − cooldown"),
    (lambda step, p, d, w, c: noam_lr(step, d, w) * 0.5 * (1 - math.cos(math.pi * min(1.0, (1 - p) / c))),
     "cosine ramp"),
    (lambda step, p, d, w, c: noam_lr(step, d, w) * (1.0 if p < 1 - c - 0.01 else (1 - p) / c), "cap the ramp at 1"),
])
def test_cooldown_more_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_cooldown(wrong)


@pytest.mark.parametrize("check, wrong, message", [
    (check_label_smoothing, lambda lg, t, eps, pad: smoothed_q(lg, t, eps, pad, lambda o, e, V: (1 - e) * o + e / (V - 1)),
     "ε/\\(V − 1\\) to every token"),
    (check_label_smoothing, lambda lg, t, eps, pad: smoothed_q(lg, t, eps, pad, lambda o, e, V: (1 - e) * o + e / V * (1 - o)),
     "the true token got 1 − ε only"),
    (check_noam_lr, lambda step, d, w: d ** -0.5 * min(1 / step, step * w ** -1.5), "you used 1 / step"),
    (check_gradient_accumulation, lambda m, c, mbs, pad: [(c(m(x), y) / int((y != pad).sum())).backward() for x, y in mbs]
     and None, "already a mean"),
    (check_gradient_accumulation, lambda m, c, mbs, pad: c(m(mbs[0][0]), mbs[0][1]).backward(), "only micro-batch 0"),
    (check_cooldown, lambda step, p, d, w, c: noam_lr(step, d, w) * min(1.0, (1 - p) * c), "multiplied \\(1 − progress\\) by cooldown"),
    (check_cooldown, lambda step, p, d, w, c: noam_lr(step, d, w) * min(1.0, (1 - p) / c) ** 0.5, "square root"),
])
def test_training_slips_named_beyond_the_issue(check, wrong, message):
    with pytest.raises(AssertionError, match=message):
        check(wrong)


def test_cooldown_that_starts_before_mid_run_is_checked():
    with pytest.raises(AssertionError, match="cooldown=0.8"):
        check_cooldown(lambda step, p, d, w, c: noam_lr(step, d, w) * (min(1.0, (1 - p) / c) if p > 0.5 else 1.0))


# ---------------------------------------------------------------- fresh4: the cooldown's crash, more named slips
def test_cooldown_ramp_not_divided_by_cooldown_is_named_not_a_crash():
    """fresh4: this answer made the checker itself raise TypeError (noam_lr() missing 'd_model')."""
    with pytest.raises(AssertionError, match="without dividing it by the cooldown's length, so it ends at 1 − cooldown"):
        check_cooldown(lambda step, p, d, w, c: noam_lr(step, d, w) * min(1.0, 1 - (p - (1 - c))))


@pytest.mark.parametrize("wrong, message", [
    (lambda step, p, d, w, c: noam_lr(step, d, w) * min(1.0, max(0.0, (p - (1 - c)) / c)), "RISES to 1 at the end"),
    (lambda step, p, d, w, c: noam_lr(step, d, w) * min(1.0, (1 - p) / c) * (1.0 if p < 1 - c / 2 else 0.5),
     "step=.*expected"),                                          # no listed slip: says where, names nothing
])
def test_cooldown_other_ramps_are_named_or_located(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_cooldown(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda step, d, w: d ** -0.5 * min(step ** -0.5, (step * w) ** -1.5), r"you raised the product, \(step \* warmup_steps\)"),
    (lambda step, d, w: min(d ** -0.5 * step ** -0.5, step * w ** -1.5), "multiplies only the decay branch"),
    (lambda step, d, w: min(step ** -0.5, d ** -0.5 * step * w ** -1.5), "multiplies only the warmup branch"),
    (lambda step, d, w: d ** -0.5 * min(step ** 0.5, step * w ** -1.5), "you used step\\^0.5"),
])
def test_noam_precedence_and_one_branch_factor_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_noam_lr(wrong)


def divides_by_the_total_only(model, criterion, micro_batches, pad_id):
    total = sum(int((y != pad_id).sum()) for _, y in micro_batches)
    for x, y in micro_batches:
        (criterion(model(x), y) / total).backward()


def weights_of_its_own(model, criterion, micro_batches, pad_id):
    """A weighting no catalogue lists: the checker reads the weights back and gives the right ones."""
    for i, (x, y) in enumerate(micro_batches):
        (criterion(model(x), y) * (0.3 + 0.1 * i)).backward()


@pytest.mark.parametrize("wrong, message", [
    (divides_by_the_total_only, "did not multiply it by its own count n_i"),
    (weights_of_its_own, r"weighted by \[0.3, 0.4, 0.5\] .* the right weights are n_i / n_total = \[6/12, 3/12, 3/12\]"),
])
def test_gradient_accumulation_weights_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_gradient_accumulation(wrong)
