"""The checkers of notebook 10's coding exercises: plausible mistakes
raise AssertionError with a message that says what is wrong, a right answer passes.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import pytest
import torch

from transformer_lib.data import token_batches
from transformer_lib.exercises.data import check_real_token_batches, check_target_mask


def real_token_batches(lengths, max_tokens):
    batches, current, src_sum, tgt_sum = [], [], 0, 0
    for i, (s, t) in enumerate(lengths):
        if current and (src_sum + s > max_tokens or tgt_sum + t > max_tokens):
            batches.append(current)
            current, src_sum, tgt_sum = [], 0, 0
        current.append(i)
        src_sum, tgt_sum = src_sum + s, tgt_sum + t
    return batches + [current] if current else batches


def real_token_batches_strict(lengths, max_tokens):
    """Off by one: a batch of exactly max_tokens real tokens is closed too early."""
    batches, current, src_sum, tgt_sum = [], [], 0, 0
    for i, (s, t) in enumerate(lengths):
        if current and (src_sum + s >= max_tokens or tgt_sum + t >= max_tokens):
            batches.append(current)
            current, src_sum, tgt_sum = [], 0, 0
        current.append(i)
        src_sum, tgt_sum = src_sum + s, tgt_sum + t
    return batches + [current] if current else batches


def target_mask(tgt_in, pad_id):
    T = tgt_in.size(1)
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1) | (tgt_in == pad_id)[:, None, :]


def test_real_token_batches_right_answer(capsys):
    assert check_real_token_batches(real_token_batches) is True
    assert "correct: batches by real tokens" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,message", [
    (lambda lengths, m: token_batches(lengths, m, shuffle=False, bucket=False), "cap the PADDED size"),
    (real_token_batches_strict, "a batch of exactly max_tokens is allowed"),
    (lambda lengths, m: [sorted(b, reverse=True) for b in real_token_batches(lengths, m)], "keep the examples in the order"),
    (lambda lengths, m: real_token_batches(lengths, m)[:-1], "exactly one batch"),
])
def test_real_token_batches_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_real_token_batches(wrong)


def test_target_mask_right_answer(capsys):
    assert check_target_mask(target_mask) is True
    assert "correct:" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,message", [
    (lambda tgt, pad: ~target_mask(tgt, pad), "inverted"),
    (lambda tgt, pad: torch.triu(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool))
     | (tgt == pad)[:, None, :], "attend to itself"),
    (lambda tgt, pad: torch.triu(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool), diagonal=1)
     .expand(tgt.size(0), -1, -1), "padding is not masked"),
    (lambda tgt, pad: torch.triu(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool), diagonal=1)
     | (tgt == pad)[:, :, None], "padding KEYS"),
    (lambda tgt, pad: target_mask(tgt, pad).int(), "boolean"),
    (lambda tgt, pad: target_mask(tgt, pad)[0], "shape"),
])
def test_target_mask_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_target_mask(wrong)
