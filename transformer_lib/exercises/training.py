"""Checkers for the coding exercises of notebook 11 (training): `check_…(your_function)`.

Hand-written, not exported (see `transformer_lib.exercises`). Each checker runs the learner's
function on small inputs and compares it with PyTorch (`F.cross_entropy`) or `transformer_lib.training`.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.exercises import call, run_checker
from transformer_lib.training import LabelSmoothingLoss, cooldown_factor, noam_lr


def _close(a, b, tol=1e-5) -> bool:
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))


def _smoothed_variants(logits: torch.Tensor, target: torch.Tensor, eps: float, pad_id: int) -> dict[str, torch.Tensor]:
    """The usual slips of a hand-written label-smoothed loss, each with the message that names it."""
    N, V = logits.shape
    log_p = logits.log_softmax(-1)                                            # (N, V)
    one_hot = F.one_hot(target, V).double()                                   # (N, V)
    real = target != pad_id                                                   # (N,)
    q = (1 - eps) * one_hot + eps / V                                         # (N, V): PyTorch's target
    per_position = -(q * log_p).sum(-1)                                       # (N,)
    annotated = ((1 - eps) * one_hot + eps / (V - 2) * (1 - one_hot)).index_fill(1, torch.tensor([pad_id]), 0.0)
    entropy = -(q * q.log()).sum(-1) if eps > 0 else torch.zeros(N, dtype=log_p.dtype)
    variants = {
        "you averaged over padding positions too: keep only positions whose target is not pad_id, and divide "
        "by their number": per_position.mean(),
        "you summed the real positions' losses but divided by ALL positions, padding included: divide by the "
        "number of real (non-padding) targets": per_position[real].sum() / N,
        "you summed over the positions; the loss is the MEAN over the real (non-padding) positions":
            per_position[real].sum(),
        "you averaged over the V classes too; sum q·log p over the vocabulary, then average over the positions":
            -(q * log_p).mean(-1)[real].mean(),
        "you used probabilities where the loss needs log-probabilities: −Σ q · log_softmax(logits)":
            -(q * logits.softmax(-1)).sum(-1)[real].mean(),
        "that is KL(q ‖ p) = cross-entropy − entropy of q; the loss is the cross-entropy −Σ q log p, which "
        "F.cross_entropy(label_smoothing=ε) computes": (per_position - entropy)[real].mean(),
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
            "the smoothing part is missing: you weighted −log p(true token) by 1 − ε, but q also puts ε/V on "
            "every token: q = (1 − ε)·one_hot + ε/V": -((1 - eps) * one_hot * log_p).sum(-1)[real].mean(),
            "your loss ignores ε: it is the plain cross-entropy; mix the one-hot target with the uniform one, "
            "q = (1 − ε)·one_hot + ε/V": -(one_hot * log_p).sum(-1)[real].mean(),
        }
    return variants


def check_label_smoothing(your_function) -> None:
    """`your_function(logits (N, V), target (N,), eps, pad_id)` -> the label-smoothed loss, a scalar."""
    def _check(fn):
        generator = torch.Generator().manual_seed(0)
        logits = torch.randn(12, 7, generator=generator)
        target = torch.randint(1, 7, (12,), generator=generator)
        target[::3] = 0                                        # a third of the positions are padding (id 0)
        for eps in (0.0, 0.1, 0.4):
            expected = F.cross_entropy(logits, target, ignore_index=0, label_smoothing=eps)
            logits_in, target_in = logits.clone(), target.clone()
            got = call(fn, logits_in, target_in, eps, 0, on=f"logits (N=12, V=7), target (N,) with 4 padding "
                       f"positions (pad_id=0), eps={eps}")
            assert torch.equal(logits_in, logits) and torch.equal(target_in, target), \
                "your function changed logits or target in place; compute on new tensors"
            assert isinstance(got, torch.Tensor) and got.dim() == 0, "return the loss as a scalar tensor (0 dimensions)"
            if _close(got, expected):
                continue
            for message, wrong in _smoothed_variants(logits.double(), target, eps, 0).items():
                if _close(got, wrong) and not _close(wrong, expected):
                    raise AssertionError(f"ε = {eps}: {message}")
            raise AssertionError(f"for ε = {eps} your loss is {float(got):.5f}, F.cross_entropy(logits, target, "
                                 f"ignore_index=pad_id, label_smoothing=ε) gives {float(expected):.5f}"
                                 + (" (even without smoothing: the mean of −log p(true token))" if eps == 0 else ""))
    run_checker("label smoothing by hand", your_function, _check)


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
        "the warmup branch is step · warmup_steps^-1.5 (a negative exponent)": d ** -0.5 * min(decay, step * w ** 1.5),
        "the warmup branch is step · warmup_steps^-1.5; you used the exponent -0.5": d ** -0.5 * min(decay, step * w ** -0.5),
        "the decay branch is step^-0.5 (it falls after the warmup); you used step^0.5": d ** -0.5 * min(step ** 0.5, linear),
    }


def check_noam_lr(your_function) -> None:
    """`your_function(step, d_model, warmup_steps)` -> the paper's learning rate (eq. 3), steps from 1."""
    def _check(fn):
        cases = [(d_model, warmup, step) for d_model, warmup in ((512, 4000), (128, 200))
                 for step in (1, 2, 10, warmup // 2, warmup - 1, warmup, warmup + 1, 4 * warmup)]
        got = {}
        for d_model, warmup, step in cases:
            value = call(fn, step, d_model, warmup, on=f"step={step}, d_model={d_model}, warmup_steps={warmup}",
                         hint=lambda e: ("eq. 3 counts steps from 1; step 1 must give d_model^-0.5 · warmup^-1.5 "
                                         "(did you use step - 1?)" if isinstance(e, ZeroDivisionError) else None))
            assert isinstance(value, (int, float)) or (torch.is_tensor(value) and value.numel() == 1), \
                f"return a number, got {type(value).__name__}"
            got[d_model, warmup, step] = float(value)
        wrong_cases = [case for case in cases if not math.isclose(got[case], noam_lr(case[2], *case[:2]), rel_tol=1e-6)]
        if not wrong_cases:
            return
        for message in _noam_slips(1, 1, 1):                 # a slip explains the answer at every step
            if all(math.isclose(got[d, w, s], _noam_slips(s, d, w)[message], rel_tol=1e-6) for d, w, s in cases):
                raise AssertionError(message)
        d_model, warmup, step = wrong_cases[0]
        where = f"d_model={d_model}, warmup={warmup}, step={step}"
        value, expected = got[d_model, warmup, step], noam_lr(step, d_model, warmup)
        linear, decay = d_model ** -0.5 * step * warmup ** -1.5, d_model ** -0.5 * step ** -0.5
        if step < warmup and math.isclose(value, decay, rel_tol=1e-6):
            raise AssertionError(f"{where}: your rate is already the decay branch d_model^-0.5 · step^-0.5; "
                                 f"until step = warmup_steps it is the linear warmup d_model^-0.5 · step · "
                                 f"warmup^-1.5 (the two branches meet AT step = warmup_steps)")
        if step > warmup and math.isclose(value, linear, rel_tol=1e-6):
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


def check_gradient_accumulation(your_function) -> None:
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
        call(fn, model, criterion, micro_batches, 0, on="3 micro-batches of 6, 10 and 4 examples (0, 7 and 1 of "
             "them padding, pad_id=0) and a linear model")
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
        last = _CountingLinear(5, 9)
        last.load_state_dict(model.state_dict())
        x, y = micro_batches[-1]
        last.zero_grad()
        criterion(last(x), y).backward()
        g_last = last.linear.weight.grad
        k = float((grad * g_last).sum() / (g_last * g_last).sum())             # grad = k · (last one's)?
        if torch.allclose(grad, k * g_last, atol=1e-6) and not torch.allclose(expected, k * g_last, atol=1e-6):
            raise AssertionError("only the last micro-batch's gradient is left: do not zero the gradients (or "
                                 "step the optimizer) between micro-batches; backward() adds into .grad")
        padded = _CountingLinear(5, 9)
        padded.load_state_dict(model.state_dict())
        total = sum(y.numel() for _, y in micro_batches)
        for x, y in micro_batches:
            (criterion(padded(x), y) * y.numel() / total).backward()
        if torch.allclose(grad, padded.linear.weight.grad, atol=1e-6):
            raise AssertionError("you weighted each micro-batch by its number of examples, padding included; the "
                                 "loss is a mean over REAL target tokens: weight by the count of targets != pad_id")
        torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-5, msg=lambda m: (
            "the accumulated gradient differs from one pass over all micro-batches together:\n" + m))
    run_checker("gradient accumulation", your_function, _check)


def check_cooldown(your_function) -> None:
    """`your_function(step, progress, d_model, warmup_steps, cooldown)` -> eq. 3 at `step` times the linear
    cooldown ramp min(1, (1 − progress) / cooldown) (1 before the last `cooldown` share of the run, 0 at its end)."""
    def _check(fn):
        d_model, warmup = 128, 200
        for cooldown in (0.25, 0.5):
            for step, progress in ((1, 0.0), (150, 0.3), (300, 0.74), (310, 0.8), (350, 0.9), (400, 1.0)):
                noam = noam_lr(step, d_model, warmup)
                expected = noam * cooldown_factor(progress, cooldown)
                got = call(fn, step, progress, d_model, warmup, cooldown, on=f"step={step}, progress={progress}, "
                           f"d_model={d_model}, warmup_steps={warmup}, cooldown={cooldown}")
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
    run_checker("the cooldown", your_function, _check)
