"""The checkers of notebook 11's coding exercises: plausible mistakes
raise AssertionError with a message that says what is wrong, a right answer passes.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import pytest
import torch
import torch.nn.functional as F

from transformer_lib.exercises.training import (check_cooldown, check_gradient_accumulation, check_label_smoothing,
                                               check_noam_lr)
from transformer_lib.training import LabelSmoothingLoss, cooldown_factor, noam_lr


# ---------------------------------------------------------------- label smoothing
def smoothed(logits, target, eps, pad_id, spread_over=None, keep_padding=False):
    V = logits.size(-1)
    log_p = logits.log_softmax(-1)
    one_hot = F.one_hot(target, V).float()
    q = (1 - eps) * one_hot + eps / V if spread_over is None else (1 - eps) * one_hot + eps * (1 - one_hot) / spread_over
    loss = -(q * log_p).sum(-1)
    return loss.mean() if keep_padding else loss[target != pad_id].mean()


def test_label_smoothing_right_answers(capsys):
    assert check_label_smoothing(smoothed) is True
    assert check_label_smoothing(lambda lg, t, eps, pad: LabelSmoothingLoss(eps, ignore_index=pad)(lg, t)) is True
    assert "correct: label smoothing by hand" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,message", [
    (lambda lg, t, eps, pad: smoothed(lg, t, eps, pad, keep_padding=True), "averaged over padding"),
    (lambda lg, t, eps, pad: smoothed(lg, t, eps, pad, spread_over=lg.size(-1) - 1), "V − 1 wrong tokens"),
    (lambda lg, t, eps, pad: smoothed(lg, t, 0.0, pad), "for ε = 0.1"),
    (lambda lg, t, eps, pad: smoothed(lg, t, eps, pad).item(), "scalar tensor"),
])
def test_label_smoothing_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_label_smoothing(wrong)


# ---------------------------------------------------------------- Noam learning rate
def test_noam_right_answers(capsys):
    assert check_noam_lr(lambda step, d, w: d ** -0.5 * min(step ** -0.5, step * w ** -1.5)) is True
    assert check_noam_lr(lambda step, d, w: noam_lr(step, d, w)) is True
    assert "correct: the Noam learning rate" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,message", [
    (lambda step, d, w: d ** -0.5 * max(step ** -0.5, step * w ** -1.5), "not max"),
    (lambda step, d, w: min(step ** -0.5, step * w ** -1.5), "d_model\\^-0.5 is missing"),
    (lambda step, d, w: d ** -0.5 * min(step ** -0.5, step * w ** -0.5), "step=1: expected"),
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


def test_gradient_accumulation_right_answer(capsys):
    assert check_gradient_accumulation(accumulate) is True
    assert "correct: gradient accumulation" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,message", [
    (equal_weights, "weighted every micro-batch equally"),
    (no_scaling, "differs from one pass|times too big"),
    (all_at_once, "one micro-batch at a time"),
    (lambda model, criterion, micro_batches, pad_id: None, "no gradient"),
])
def test_gradient_accumulation_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_gradient_accumulation(wrong)


# ---------------------------------------------------------------- the cooldown
def cooled(step, progress, d_model, warmup, cooldown):
    return noam_lr(step, d_model, warmup) * min(1.0, (1 - progress) / cooldown)


def test_cooldown_right_answers(capsys):
    assert check_cooldown(cooled) is True
    assert check_cooldown(lambda step, p, d, w, c: noam_lr(step, d, w) * cooldown_factor(p, c)) is True
    assert "correct: the cooldown" in capsys.readouterr().out


def test_cooldown_stub_is_not_attempted(capsys):
    def stub(step, progress, d_model, warmup, cooldown):
        raise NotImplementedError
    assert check_cooldown(stub) is False
    assert "the cooldown: not attempted yet" in capsys.readouterr().out


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
