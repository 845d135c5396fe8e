"""The checkers of notebook 08's exercises: plausible wrong answers -> AssertionError
with a message that says what is wrong, right answers -> True.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import pytest
import torch

from transformer_lib.exercises.decoder import check_causal_mask, check_is_causal


def right_causal_mask(T):
    positions = torch.arange(T)
    return positions[None, :] > positions[:, None]          # key j after query i


def test_causal_mask_right(capsys):
    assert check_causal_mask(right_causal_mask) is True
    assert "correct: causal_mask" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [
    (lambda T: torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1), "without torch.triu"),
    (lambda T: ~right_causal_mask(T), "marks the allowed keys"),
    (lambda T: right_causal_mask(T).T, "blocks the PAST"),
    (lambda T: torch.arange(T)[None, :] >= torch.arange(T)[:, None], "diagonal must be False"),
    (lambda T: right_causal_mask(T).int(), "must be bool"),
])
def test_causal_mask_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_causal_mask(wrong)


def right_is_causal(decoder, tgt, memory):
    base = decoder(tgt, memory)
    T = tgt.size(1)
    for j in range(1, T):
        edited = tgt.clone()
        edited[:, j] = edited[:, j] + 1.0
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


def test_is_causal_right(capsys):
    assert check_is_causal(right_is_causal) is True
    assert "correct: is_causal" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [(lambda d, t, m: True, "WITHOUT the causal mask"),
                                            (lambda d, t, m: False, "said False"),
                                            (only_next_position, "not only the next one"),
                                            (only_first_output, "not only the first")])
def test_is_causal_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_is_causal(wrong)
