"""The checkers of notebook 12's coding exercises: an unfilled stub, plausible wrong answers, right answers."""
import pytest
import torch

from transformer_lib.attention import subsequent_mask
from transformer_lib.decoding import greedy_decode, length_penalty
from transformer_lib.exercises.decoding import check_greedy_decode, check_length_normalised_score


def test_score_right_answers(capsys):
    assert check_length_normalised_score(lambda log_p, length, alpha: log_p / ((5 + length) / 6) ** alpha)
    assert check_length_normalised_score(lambda log_p, length, alpha: log_p / length_penalty(length, alpha))
    assert "correct: length-normalised score" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,message", [
    (lambda log_p, length, alpha: log_p / (5 + length) ** alpha, "divides 5 \\+ \\|Y\\| by 6"),
    (lambda log_p, length, alpha: log_p * ((5 + length) / 6) ** alpha, "Divide log P by lp"),
    (lambda log_p, length, alpha: log_p / ((5 + length) / 6), "power α"),
    (lambda log_p, length, alpha: log_p / length ** alpha, r"not \|Y\|\^α"),
])
def test_score_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_length_normalised_score(wrong)


@torch.no_grad()
def reference_greedy(model, src, mask, bos_id, eos_id, max_len, causal=True, strip=True, use_mask=True):
    memory = model.encode(src, mask if use_mask else None)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    for _ in range(max_len):
        tgt_mask = subsequent_mask(ys.size(1)) if causal else None
        hidden = model.decode(ys, memory, tgt_mask, None, mask if use_mask else None)
        ys = torch.cat([ys, model.generator(hidden[:, -1]).argmax(-1, keepdim=True)], dim=1)
        if (ys == eos_id).any(dim=1).all():
            break
    rows = ys[:, 1:].tolist()
    return [r[:r.index(eos_id)] if strip and eos_id in r else r for r in rows]


def test_greedy_right_answers(capsys):
    assert check_greedy_decode(reference_greedy)
    assert check_greedy_decode(lambda *args: greedy_decode(*args))
    assert "correct: greedy decoding" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,message", [
    (lambda *a: reference_greedy(*a, strip=False), "contains </s>"),
    (lambda *a: reference_greedy(*a, causal=False), "causal mask"),
    (lambda *a: reference_greedy(*a, use_mask=False), "padding mask"),
    (lambda m, s, k, b, e, n: reference_greedy(m, s, k, b, e, n + 1), "stop after max_len tokens"),
])
def test_greedy_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_greedy_decode(wrong)
