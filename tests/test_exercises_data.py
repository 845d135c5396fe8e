"""The checkers of notebook 10's coding exercises: plausible mistakes
raise AssertionError with a message that says what is wrong, a right answer passes.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import pytest
import torch

from transformer_lib.data import token_batches
from transformer_lib.exercises.data import check_real_token_batches, check_target_mask


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



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


def real_token_batches_rule(lengths, max_tokens, too_many):
    batches, current, src_sum, tgt_sum = [], [], 0, 0
    for i, (s, t) in enumerate(lengths):
        if current and too_many(src_sum + s, tgt_sum + t, max_tokens):
            batches.append(current)
            current, src_sum, tgt_sum = [], 0, 0
        current.append(i)
        src_sum, tgt_sum = src_sum + s, tgt_sum + t
    return batches + [current] if current else batches


def real_token_batches_lookahead(lengths, max_tokens):
    """Another right answer: indices first, sums recomputed from the batch."""
    batches = [[]]
    for i in range(len(lengths)):
        candidate = batches[-1] + [i]
        fits = all(sum(lengths[j][side] for j in candidate) <= max_tokens for side in (0, 1))
        if fits or not batches[-1]:
            batches[-1] = candidate
        else:
            batches.append([i])
    return [b for b in batches if b]


def test_real_token_batches_as_tuples_are_told_the_statement_asks_for_lists():
    def as_tuples(lengths, max_tokens):
        return [tuple(b) for b in real_token_batches_lookahead(lengths, max_tokens)]

    with pytest.raises(AssertionError, match=r"the right batches, but return a list of batches.*a tuple \(\(0, 1, 2\)\)"):
        check_real_token_batches(as_tuples)


def target_mask(tgt_in, pad_id):
    T = tgt_in.size(1)
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1) | (tgt_in == pad_id)[:, None, :]


@pytest.mark.parametrize("right", [real_token_batches, real_token_batches_lookahead])
def test_real_token_batches_right_answers(right):
    assert accepted(check_real_token_batches, right)


@pytest.mark.parametrize("wrong,message", [
    (lambda lengths, m: real_token_batches_rule(lengths, m, lambda s, t, m: s > m), "count the target side too"),
    (lambda lengths, m: real_token_batches_rule(lengths, m, lambda s, t, m: s + t > m), "not their sum"),
    (lambda lengths, m: [[]] + real_token_batches(lengths, m), "an empty batch"),
    (lambda lengths, m: real_token_batches(lengths, m)[0], "list of batches, each a list of example indices"),
    (lambda lengths, m: token_batches(lengths, m, shuffle=False, bucket=False), "cap the PADDED size"),
    (real_token_batches_strict, "exactly max_tokens real tokens is allowed"),
    (lambda lengths, m: [sorted(b, reverse=True) for b in real_token_batches(lengths, m)], "keep the examples in the order"),
    (lambda lengths, m: real_token_batches(lengths, m)[:-1], "exactly one batch"),
])
def test_real_token_batches_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_real_token_batches(wrong)


def target_mask_loops(tgt_in, pad_id):
    B, T = tgt_in.shape
    mask = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            for j in range(T):
                mask[b, t, j] = j > t or tgt_in[b, j].item() == pad_id
    return mask


@pytest.mark.parametrize("right", [target_mask, target_mask_loops])
def test_target_mask_right_answers(right):
    assert accepted(check_target_mask, right)


@pytest.mark.parametrize("wrong,message", [
    (lambda tgt, pad: torch.triu(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool), diagonal=1)
     & (tgt == pad)[:, None, :], "combine the two masks with \\|"),
    (lambda tgt, pad: torch.triu(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool), diagonal=1)
     | (tgt == pad)[None, :, :], "raised RuntimeError|shape"),
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


def real_token_batches_empty_first(lengths, max_tokens):
    """The first set's accepted wrong answer: an empty batch before an oversized first example."""
    batches, current, src_sum, tgt_sum = [], [], 0, 0
    for i, (s, t) in enumerate(lengths):
        if src_sum + s > max_tokens or tgt_sum + t > max_tokens:
            batches.append(current)
            current, src_sum, tgt_sum = [], 0, 0
        current.append(i)
        src_sum, tgt_sum = src_sum + s, tgt_sum + t
    return batches + [current] if current else batches


def real_token_batches_drops_long(lengths, max_tokens):
    kept = [(i, st) for i, st in enumerate(lengths) if max(st) <= max_tokens]
    batches = real_token_batches([st for _, st in kept], max_tokens)
    return [[kept[j][0] for j in b] for b in batches]


def real_token_batches_joins_long(lengths, max_tokens):
    """Puts the next example into an oversized example's batch."""
    batches, current, src_sum, tgt_sum = [], [], 0, 0
    for i, (s, t) in enumerate(lengths):
        if current and (src_sum + s > max_tokens or tgt_sum + t > max_tokens) and len(current) > 1:
            batches.append(current)
            current, src_sum, tgt_sum = [], 0, 0
        elif current and (src_sum + s > max_tokens or tgt_sum + t > max_tokens) and src_sum <= max_tokens \
                and tgt_sum <= max_tokens:
            batches.append(current)
            current, src_sum, tgt_sum = [], 0, 0
        current.append(i)
        src_sum, tgt_sum = src_sum + s, tgt_sum + t
    return batches + [current] if current else batches


def real_token_batches_memorised(lengths, max_tokens):
    return {10: [[0, 1], [2, 3], [4, 5], [6, 7], [8], [9]], 12: [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9]],
            30: [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9]]}.get(max_tokens, [])


def test_real_token_batches_empty_batch_before_an_oversized_example_is_named():
    assert real_token_batches_empty_first([(12, 1), (1, 1), (2, 2)], 10) == [[], [0], [1, 2]]
    with pytest.raises(AssertionError, match=r"max_tokens=10 gave an empty batch.*a batch of its own"):
        check_real_token_batches(real_token_batches_empty_first)


@pytest.mark.parametrize("wrong, message", [
    (real_token_batches_drops_long, "were dropped"),
    (real_token_batches_joins_long, "gets a batch of its own, not"),
    (real_token_batches_memorised, "expected|exactly one batch|an empty batch|more than max_tokens"),
    (lambda lengths, m: [list(range(len(lengths)))], "more than max_tokens=10"),
])
def test_real_token_batches_more_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_real_token_batches(wrong)


def target_mask_broadcast(tgt_in, pad_id):
    """Another right answer: comparisons of aranges, the padding as a (B, 1, T) row."""
    positions = torch.arange(tgt_in.size(1))
    return (positions[None, :] > positions[:, None])[None] | (tgt_in == pad_id).unsqueeze(1)


def test_target_mask_more_right():
    assert accepted(check_target_mask, target_mask_broadcast)


@pytest.mark.parametrize("wrong, message", [
    (lambda tgt, pad: target_mask(tgt, 0), "you masked the keys whose token is 0"),
    (lambda tgt, pad: target_mask(torch.tensor([[1, 5, 6, 7, 8], [1, 9, 4, 0, 0], [1, 3, 0, 0, 0]]), 0),
     "expected shape|pad_id=7"),
])
def test_target_mask_more_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_target_mask(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda tgt, pad: torch.triu(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool), 1) | (tgt != pad)[:, None, :],
     "keys that are real tokens"),
    (lambda tgt, pad: target_mask(tgt, pad).transpose(1, 2), "transposed"),
])
def test_target_mask_named_beyond_the_issue(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_target_mask(wrong)


def real_token_batches_no_reset(lengths, max_tokens):
    """The counts are never set back to 0 when a batch closes."""
    batches, current, src_sum, tgt_sum = [], [], 0, 0
    for i, (s, t) in enumerate(lengths):
        if current and (src_sum + s > max_tokens or tgt_sum + t > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
        src_sum, tgt_sum = src_sum + s, tgt_sum + t
    return batches + [current] if current else batches


def test_real_token_batches_counts_that_never_restart_are_named():
    with pytest.raises(AssertionError, match="start again from 0"):
        check_real_token_batches(real_token_batches_no_reset)
