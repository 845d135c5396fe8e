"""The checkers of notebook 08's exercises: plausible wrong answers -> AssertionError
with a message that says what is wrong, right answers (several ways of writing them) -> "correct".
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import pytest
import torch

from transformer_lib.exercises.decoder import check_causal_mask, check_is_causal


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



def right_causal_mask(T):
    positions = torch.arange(T)
    return positions[None, :] > positions[:, None]          # key j after query i


def causal_mask_loops(T):
    mask = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(i + 1, T):
            mask[i, j] = True
    return mask


@pytest.mark.parametrize("right", [right_causal_mask, causal_mask_loops])
def test_causal_mask_right(right):
    assert accepted(check_causal_mask, right)


@pytest.mark.parametrize("wrong, message", [
    (lambda T: torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1), "without torch.triu"),
    (lambda T: ~right_causal_mask(T), "marks the allowed keys"),
    (lambda T: right_causal_mask(T).T, "blocks the PAST"),
    (lambda T: torch.arange(T)[None, :] >= torch.arange(T)[:, None], "diagonal must be False"),
    (lambda T: right_causal_mask(T).int(), "must be bool"),
    (lambda T: torch.arange(T)[None, :] > torch.arange(T)[:, None] + 1, "off by one"),
    (lambda T: torch.arange(T)[None, :] > torch.arange(T - 1)[:, None], r"shape \(5, 5\)"),
    (lambda T: right_causal_mask(T).tolist(), "return a torch.Tensor"),
    (lambda T: torch.zeros(T, T, dtype=torch.bool).fill_diagonal_(True, wrap=False)[:, :T - 1], r"shape"),
])
def test_causal_mask_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_causal_mask(wrong)


def right_is_causal(decoder, tgt, memory):
    base = decoder(tgt, memory)
    T = tgt.size(1)
    for j in range(1, T):
        edited = tgt.clone()
        edited[:, j] = torch.randn_like(edited[:, j])                     # a different vector, not a shift
        moved = (decoder(edited, memory) - base).abs().amax(dim=(0, 2))   # (T,)
        if (moved[:j] > 1e-6).any():
            return False
    return True


def only_next_position(decoder, tgt, memory):          # changes position i + 1 only, for each output i
    base = decoder(tgt, memory)
    for i in range(tgt.size(1) - 1):
        edited = tgt.clone()
        edited[:, i + 1] += 1.0
        if (decoder(edited, memory) - base)[:, i].abs().max() > 1e-6:
            return False
    return True


def only_first_output(decoder, tgt, memory):           # looks at output 0 only
    base = decoder(tgt, memory)
    for j in range(1, tgt.size(1)):
        edited = tgt.clone()
        edited[:, j] += 1.0
        if (decoder(edited, memory) - base)[:, 0].abs().max() > 1e-6:
            return False
    return True


def is_causal_by_gradients(decoder, tgt, memory):
    """Another right answer: output i has no gradient with respect to any later position."""
    with torch.enable_grad():
        tgt = tgt.clone().requires_grad_(True)
        out = decoder(tgt, memory)
        for i in range(tgt.size(1) - 1):
            grad, = torch.autograd.grad(out[:, i].sum(), tgt, retain_graph=True)
            if grad[:, i + 1:].abs().max() > 0:
                return False
    return True


def edits_in_place(decoder, tgt, memory):
    base = decoder(tgt, memory).clone()
    for j in range(1, tgt.size(1)):
        tgt[:, j] += 1.0                                      # forgets to clone: the caller's tgt changes
        if (decoder(tgt, memory) - base)[:, :j].abs().max() > 1e-6:
            return False
    return True


def includes_own_position(decoder, tgt, memory):        # demands that output j not move when j itself changes
    base = decoder(tgt, memory)
    for j in range(tgt.size(1)):
        edited = tgt.clone()
        edited[:, j] += 1.0
        if (decoder(edited, memory) - base)[:, :j + 1].abs().max() > 1e-6:
            return False
    return True


def returns_a_tensor(decoder, tgt, memory):
    return torch.tensor(1.0) if right_is_causal(decoder, tgt, memory) else torch.tensor(0.0)


def shifts_each_position(decoder, tgt, memory):         # + 1.0 to every feature: LayerNorm removes it
    base = decoder(tgt, memory)
    for j in range(1, tgt.size(1)):
        edited = tgt.clone()
        edited[:, j] = edited[:, j] + 1.0
        if (decoder(edited, memory) - base)[:, :j].abs().max() > 1e-6:
            return False
    return True


def only_last_position(decoder, tgt, memory):          # changes position T - 1 only, compares every output
    base = decoder(tgt, memory)
    edited = tgt.clone()
    edited[:, -1] = torch.randn_like(edited[:, -1])
    return bool(torch.allclose(decoder(edited, memory)[:, :-1], base[:, :-1]))


@pytest.mark.parametrize("right", [right_is_causal, is_causal_by_gradients,
                                   lambda d, t, m: bool(torch.tensor(right_is_causal(d, t, m)))])
def test_is_causal_right(right):
    assert accepted(check_is_causal, right)


@pytest.mark.parametrize("wrong, message", [(lambda d, t, m: True, "WITHOUT the causal mask"),
                                            (lambda d, t, m: False, "said False"),
                                            (only_next_position, "not only the next one"),
                                            (only_first_output, "not only the first"),
                                            (edits_in_place, "changed its input `tgt` in place"),
                                            (includes_own_position, r"j itself included.*out\[:, :j\]"),
                                            (returns_a_tensor, "return True or False"),
                                            (lambda d, t, m: torch.tensor(right_is_causal(d, t, m)),
                                             r"a Python bool, got a tensor of shape \(\) \(tensor\(True\)\)"),
                                            (shifts_each_position, "pre-LN decoder WITHOUT the causal mask.*"
                                             "a constant shift is removed by LayerNorm"),
                                            (only_last_position, r"output 2 sees position 3.*you changed only the LAST position"),
                                            (lambda d, t, m: d(t[:, :-1], m), "return True or False"),
                                            (lambda d, t, m: d(t, m.transpose(0, 1)), "raised|return True or False, got a tensor")])
def test_is_causal_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_is_causal(wrong)


def is_causal_by_gradients_plainly(decoder, tgt, memory):
    """A right answer that relies on autograd being on, as the stub promises nothing else."""
    tgt = tgt.clone().requires_grad_(True)
    out = decoder(tgt, memory)
    for i in range(tgt.size(1) - 1):
        grad, = torch.autograd.grad(out[:, i].sum(), tgt, retain_graph=True, allow_unused=True)
        if grad is not None and grad[:, i + 1:].abs().max() > 0:
            return False
    return True


def checks_six_positions(decoder, tgt, memory):
    """Hard-wired to the fixed cases' length T = 6."""
    base = decoder(tgt, memory)
    for j in range(1, 6):
        edited = tgt.clone()
        edited[:, j] += 1.0
        if (decoder(edited, memory) - base)[:, :j].abs().max() > 1e-6:
            return False
    return True


def test_is_causal_right_with_autograd():
    assert accepted(check_is_causal, is_causal_by_gradients_plainly)


def test_is_causal_hard_wired_length_is_caught():
    with pytest.raises(AssertionError, match="depends on the later position"):
        check_is_causal(checks_six_positions)


def test_causal_mask_refuses_subsequent_mask():
    from transformer_lib.attention import subsequent_mask
    with pytest.raises(AssertionError, match="without torch.triu or torch.tril \\(or subsequent_mask"):
        check_causal_mask(lambda T: subsequent_mask(T))
    with pytest.raises(AssertionError, match="without torch.triu"):
        check_causal_mask(lambda T: torch.ones(T, T, dtype=torch.bool).triu_(1))


def test_causal_mask_that_masks_nothing_is_named():
    with pytest.raises(AssertionError, match="masks nothing"):
        check_causal_mask(lambda T: torch.zeros(T, T, dtype=torch.bool))


def test_is_causal_with_an_invisible_change_is_named():
    def tiny_change(decoder, tgt, memory):
        base = decoder(tgt, memory)
        for j in range(1, tgt.size(1)):
            edited = tgt.clone()
            edited[:, j] += 1e-9
            if not torch.equal(decoder(edited, memory)[:, :j], base[:, :j]):
                return False
        return True

    with pytest.raises(AssertionError, match="WITHOUT the causal mask.*a different vector"):
        check_is_causal(tiny_change)
