"""Checkers for the coding exercises of notebook 11 (training): `check_…(your_function)`.

Hand-written, not exported (see `transformer_lib.exercises`). Each checker runs the learner's
function on small inputs and compares it with PyTorch (`F.cross_entropy`) or `transformer_lib.training`.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.exercises import run_checker
from transformer_lib.training import LabelSmoothingLoss, cooldown_factor, noam_lr


def _close(a, b, tol=1e-5) -> bool:
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))


def check_label_smoothing(your_function) -> bool:
    """`your_function(logits (N, V), target (N,), eps, pad_id)` -> the label-smoothed loss, a scalar."""
    def _check(fn):
        generator = torch.Generator().manual_seed(0)
        logits = torch.randn(12, 7, generator=generator)
        target = torch.randint(1, 7, (12,), generator=generator)
        target[::3] = 0                                        # a third of the positions are padding (id 0)
        real = target != 0
        for eps in (0.0, 0.1, 0.4):
            expected = F.cross_entropy(logits, target, ignore_index=0, label_smoothing=eps)
            got = fn(logits.clone(), target.clone(), eps, 0)
            assert isinstance(got, torch.Tensor) and got.dim() == 0, "return the loss as a scalar tensor (0 dimensions)"
            if _close(got, expected):
                continue
            log_p = logits.log_softmax(-1)
            safe = target.clamp(min=0)
            per_position = (1 - eps) * -log_p.gather(1, safe[:, None])[:, 0] + eps * -log_p.mean(-1)
            if _close(got, per_position.mean()):
                raise AssertionError("you averaged over padding positions too: keep only positions whose target "
                                     "is not pad_id, and divide by their number")
            others = (-log_p.sum(-1) + log_p.gather(1, safe[:, None])[:, 0]) / (logits.size(1) - 1)
            wrong_spread = ((1 - eps) * -log_p.gather(1, safe[:, None])[:, 0] + eps * others)[real].mean()
            if eps > 0 and _close(got, wrong_spread):
                raise AssertionError("you spread ε over the V − 1 wrong tokens; PyTorch (and the paper's q) give "
                                     "ε/V to every token, the true one included: q = (1 − ε)·one_hot + ε/V")
            raise AssertionError(f"for ε = {eps} your loss is {float(got):.5f}, F.cross_entropy(logits, target, "
                                 f"ignore_index=pad_id, label_smoothing=ε) gives {float(expected):.5f}"
                                 + (" (even without smoothing: the mean of −log p(true token))" if eps == 0 else ""))
    return run_checker("label smoothing by hand", your_function, _check)


def check_noam_lr(your_function) -> bool:
    """`your_function(step, d_model, warmup_steps)` -> the paper's learning rate (eq. 3), steps from 1."""
    def _check(fn):
        for d_model, warmup in ((512, 4000), (128, 200)):
            for step in (1, 10, warmup // 2, warmup, warmup + 1, 4 * warmup):
                expected = noam_lr(step, d_model, warmup)
                got = fn(step, d_model, warmup)
                assert isinstance(got, (int, float)) or (torch.is_tensor(got) and got.numel() == 1), \
                    f"return a number, got {type(got).__name__}"
                if math.isclose(float(got), expected, rel_tol=1e-6):
                    continue
                if math.isclose(float(got), d_model ** -0.5 * max(step ** -0.5, step * warmup ** -1.5), rel_tol=1e-6):
                    raise AssertionError("use min(...), not max(...): the rate is the LOWER of the two branches")
                if math.isclose(float(got), expected * d_model ** 0.5, rel_tol=1e-6):
                    raise AssertionError("the factor d_model^-0.5 is missing")
                raise AssertionError(f"d_model={d_model}, warmup={warmup}, step={step}: expected {expected:.6g}, got "
                                     f"{float(got):.6g}; lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)")
    return run_checker("the Noam learning rate", your_function, _check)


class _CountingLinear(nn.Module):
    """nn.Linear that remembers the largest batch it saw, to check that micro-batches stay apart."""

    def __init__(self, d_in: int, v: int):
        super().__init__()
        self.linear, self.largest = nn.Linear(d_in, v), 0

    def forward(self, x):
        self.largest = max(self.largest, x.size(0))
        return self.linear(x)


def check_gradient_accumulation(your_function) -> bool:
    """`your_function(model, criterion, micro_batches, pad_id)` leaves in `.grad` the gradient of the
    loss over all micro-batches together, running one micro-batch at a time."""
    def _check(fn):
        generator = torch.Generator().manual_seed(0)
        micro_batches = []
        for n, n_pad in ((6, 0), (10, 7), (4, 1)):             # different numbers of real targets
            x = torch.randn(n, 5, generator=generator)
            y = torch.randint(1, 9, (n,), generator=generator)
            y[:n_pad] = 0
            micro_batches.append((x, y))
        criterion = LabelSmoothingLoss(0.1, ignore_index=0)
        torch.manual_seed(0)
        model = _CountingLinear(5, 9)
        reference, equal_weights = _CountingLinear(5, 9), _CountingLinear(5, 9)
        reference.load_state_dict(model.state_dict())
        equal_weights.load_state_dict(model.state_dict())
        criterion(reference(torch.cat([x for x, _ in micro_batches])), torch.cat([y for _, y in micro_batches])).backward()
        fn(model, criterion, micro_batches, 0)
        assert model.largest <= 10, ("run the model on one micro-batch at a time, not on all of them "
                                     "concatenated: that is the point of accumulating")
        grad, expected = model.linear.weight.grad, reference.linear.weight.grad
        assert grad is not None, "no gradient: call backward() on each micro-batch's loss"
        if torch.allclose(grad, expected * len(micro_batches), atol=1e-6):
            raise AssertionError(f"the gradient is {len(micro_batches)} times too big: scale each micro-batch's loss")
        for x, y in micro_batches:
            (criterion(equal_weights(x), y) / len(micro_batches)).backward()
        if torch.allclose(grad, equal_weights.linear.weight.grad, atol=1e-6):
            raise AssertionError("you weighted every micro-batch equally; the loss is a mean over real target "
                                 "tokens, so weight each micro-batch by its share of them: n_i / n_total")
        torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-5, msg=lambda m: (
            "the accumulated gradient differs from one pass over all micro-batches together:\n" + m))
    return run_checker("gradient accumulation", your_function, _check)


def check_cooldown(your_function) -> bool:
    """`your_function(step, progress, d_model, warmup_steps, cooldown)` -> eq. 3 at `step` times the linear
    cooldown ramp min(1, (1 − progress) / cooldown) (1 before the last `cooldown` share of the run, 0 at its end)."""
    def _check(fn):
        d_model, warmup = 128, 200
        for cooldown in (0.25, 0.5):
            for step, progress in ((1, 0.0), (150, 0.3), (300, 0.74), (310, 0.8), (350, 0.9), (400, 1.0)):
                noam = noam_lr(step, d_model, warmup)
                expected = noam * cooldown_factor(progress, cooldown)
                got = fn(step, progress, d_model, warmup, cooldown)
                assert isinstance(got, (int, float)) or (torch.is_tensor(got) and got.numel() == 1), \
                    f"return a number, got {type(got).__name__}"
                if math.isclose(float(got), expected, rel_tol=1e-6, abs_tol=1e-12):
                    continue
                where = f"step={step}, progress={progress}, cooldown={cooldown}"
                if math.isclose(float(got), noam * (1 - progress), rel_tol=1e-6, abs_tol=1e-12):
                    raise AssertionError(f"{where}: your ramp starts at the beginning of the run; it must stay at 1 "
                                         "until the last `cooldown` share: min(1, (1 − progress) / cooldown)")
                if math.isclose(float(got), noam * (1 - progress) / cooldown, rel_tol=1e-6, abs_tol=1e-12):
                    raise AssertionError(f"{where}: cap the ramp at 1: before the cooldown the rate is eq. 3 "
                                         "unchanged, min(1, (1 − progress) / cooldown)")
                if math.isclose(float(got), noam, rel_tol=1e-6):
                    raise AssertionError(f"{where}: your rate is eq. 3 unchanged; over the last `cooldown` share of "
                                         "the run multiply it by (1 − progress) / cooldown, which reaches 0 at the end")
                if math.isclose(float(got), noam * min(1.0, progress / cooldown), rel_tol=1e-6, abs_tol=1e-12):
                    raise AssertionError(f"{where}: your ramp rises with progress; it must fall to 0 at "
                                         "progress 1: use 1 − progress")
                raise AssertionError(f"{where}: expected {expected:.6g}, got {float(got):.6g}; the rate is "
                                     "noam_lr(step) · min(1, (1 − progress) / cooldown)")
    return run_checker("the cooldown", your_function, _check)
