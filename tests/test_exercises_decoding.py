"""The checkers of notebook 12's coding exercises: an unfilled stub, plausible wrong answers, right answers."""
import contextlib
import io
import math

import pytest
import torch

from transformer_lib.attention import subsequent_mask
from transformer_lib.decoding import greedy_decode, length_penalty
from transformer_lib.exercises.decoding import check_greedy_decode, check_length_normalised_score


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



@pytest.mark.parametrize("right", [
    lambda log_p, length, alpha: log_p / ((5 + length) / 6) ** alpha,
    lambda log_p, length, alpha: log_p * (6 / (5 + length)) ** alpha,
])
def test_score_right_answers(right):
    assert accepted(check_length_normalised_score, right)


@pytest.mark.parametrize("wrong,message", [
    (lambda log_p, length, alpha: log_p / (5 + length) ** alpha, "divides 5 \\+ \\|Y\\| by 6"),
    (lambda log_p, length, alpha: log_p * ((5 + length) / 6) ** alpha, "Divide log P by lp"),
    (lambda log_p, length, alpha: log_p / ((5 + length) / 6), "power α"),
    (lambda log_p, length, alpha: log_p / length ** alpha, r"not \|Y\|\^α"),
    (lambda log_p, length, alpha: log_p / math.pow((5 + length) / 6, alpha), "raised ValueError.*use \\*\\*"),
    (lambda log_p, length, alpha: [log_p], "return a number"),
])
def test_score_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_length_normalised_score(wrong)


@torch.no_grad()
def reference_greedy(model, src, mask, bos_id, eos_id, max_len, causal=True, strip=True, use_mask=True,
                     stop="all", encoder_mask=True, position=-1):
    memory = model.encode(src, mask if encoder_mask else None)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    for _ in range(max_len):
        tgt_mask = subsequent_mask(ys.size(1)) if causal else None
        hidden = model.decode(ys, memory, tgt_mask, None, mask if use_mask else None)
        ys = torch.cat([ys, model.generator(hidden[:, position]).argmax(-1, keepdim=True)], dim=1)
        ended = (ys == eos_id).any(dim=1)
        if stop == "all" and ended.all() or stop == "any" and ended.any():
            break
    rows = ys[:, 1:].tolist()
    if strip == "drop ids":
        return [[i for i in r if i != eos_id] for r in rows]
    return [r[:r.index(eos_id)] if strip and eos_id in r else r for r in rows]


@torch.no_grad()
def cached_greedy(model, src, mask, bos_id, eos_id, max_len):
    """Another right answer: the key/value cache, one new position per step, a `done` flag per sentence."""
    memory = model.encode(src, mask)
    cache = model.new_cache()
    last = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    out, done = [[] for _ in range(src.size(0))], [False] * src.size(0)
    for _ in range(max_len):
        hidden = model.decode(last, memory, None, None, mask, cache)
        last = model.generator(hidden[:, -1]).argmax(-1, keepdim=True)
        for b, token in enumerate(last[:, 0].tolist()):
            if not done[b]:
                if token == eos_id:
                    done[b] = True
                else:
                    out[b].append(token)
        if all(done):
            break
    return out


@torch.no_grad()
def one_sentence_at_a_time(model, src, mask, bos_id, eos_id, max_len):
    """Another right answer: each sentence alone, without its padding, with the model's forward()."""
    outputs = []
    for b in range(src.size(0)):
        sentence = src[b:b + 1, : int((~mask[b]).sum())]                 # (1, S_b): no padding left
        ys = torch.tensor([[bos_id]])
        for _ in range(max_len):
            token = int(model(sentence, ys)[0, -1].argmax())
            if token == eos_id:
                break
            ys = torch.cat([ys, torch.tensor([[token]])], dim=1)
        outputs.append(ys[0, 1:].tolist())
    return outputs


@torch.no_grad()
def shrinking_batch(model, src, mask, bos_id, eos_id, max_len):
    """Another right answer: finished sentences leave the batch."""
    memory = model.encode(src, mask)
    alive = torch.arange(src.size(0))
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    results = [None] * src.size(0)
    for step in range(max_len):
        causal = torch.ones(ys.size(1), ys.size(1), dtype=torch.bool).triu(1)
        hidden = model.decode(ys, memory[alive], causal, None, mask[alive])
        ys = torch.cat([ys, model.generator(hidden[:, -1]).argmax(-1, keepdim=True)], dim=1)
        ended = (ys[:, -1] == eos_id) | (step == max_len - 1)
        for row, b in zip(ys[ended], alive[ended].tolist()):
            results[b] = row[1:][row[1:] != eos_id].tolist()
        ys, alive = ys[~ended], alive[~ended]
        if len(alive) == 0:
            break
    return results


@pytest.mark.parametrize("right", [reference_greedy, cached_greedy,
                                   one_sentence_at_a_time, shrinking_batch])
def test_greedy_right_answers(right):
    assert accepted(check_greedy_decode, right)


def test_greedy_rows_as_tensors_are_told_the_statement_asks_for_lists():
    def tensor_rows(*args):
        return [torch.tensor(row, dtype=torch.long) for row in shrinking_batch(*args)]

    with pytest.raises(AssertionError, match=r"the right ids, but return a list of lists of ints.*a tensor of shape"):
        check_greedy_decode(tensor_rows)


@torch.no_grad()
def ignores_eos_then_strips(model, src, mask, bos_id, eos_id, max_len):
    """The issue's first hole: always max_len steps, cut at </s> afterwards (same tokens, wasted steps)."""
    memory = model.encode(src, mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    for _ in range(max_len):
        hidden = model.decode(ys, memory, subsequent_mask(ys.size(1)), None, mask)
        ys = torch.cat([ys, model.generator(hidden[:, -1]).argmax(-1, keepdim=True)], dim=1)
    rows = ys[:, 1:].tolist()
    return [r[:r.index(eos_id)] if eos_id in r else r for r in rows]


@torch.no_grad()
def mask_as_target_padding(model, src, mask, bos_id, eos_id, max_len):
    memory = model.encode(src, mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    for _ in range(max_len):
        hidden = model.decode(ys, memory, subsequent_mask(ys.size(1)), mask)
        ys = torch.cat([ys, model.generator(hidden[:, -1]).argmax(-1, keepdim=True)], dim=1)
        if (ys == eos_id).any(dim=1).all():
            break
    return [r[:r.index(eos_id)] if eos_id in r else r for r in ys[:, 1:].tolist()]


def padded_tensor(model, src, mask, bos_id, eos_id, max_len):
    rows = reference_greedy(model, src, mask, bos_id, eos_id, max_len)
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


@pytest.mark.parametrize("wrong,message", [
    (lambda *a: reference_greedy(*a, strip=False), "still holds its </s>"),
    (lambda *a: reference_greedy(*a, strip="drop ids"), "kept what the model wrote AFTER </s>"),
    (lambda *a: reference_greedy(*a, causal=False), "no causal mask"),
    (lambda *a: reference_greedy(*a, use_mask=False), "memory_key_padding_mask"),
    (lambda *a: reference_greedy(*a, encoder_mask=False), "encoder does not get the source padding mask"),
    (lambda *a: reference_greedy(*a, use_mask=False, encoder_mask=False), "ignored in both encode and decode"),
    (lambda m, s, k, b, e, n: reference_greedy(m, s, ~k, b, e, n), "inverted"),
    (lambda *a: reference_greedy(*a, stop="any"), "stopped when the FIRST sentence ended"),
    (lambda *a: reference_greedy(*a, position=0), "FIRST position"),
    (ignores_eos_then_strips, "every sentence had produced </s> after 8 steps, but your decoder went on to 12"),
    (lambda m, s, k, b, e, n: reference_greedy(m, s, k, b, e, n + 1), "one token more than max_len"),
    (lambda m, s, k, b, e, n: reference_greedy(m, s, k, b, e, n - 1), "one token fewer than max_len"),
    (lambda m, s, k, b, e, n: [[b] + r for r in reference_greedy(m, s, k, b, e, n)], "drop the leading <s>"),
    (padded_tensor, "one list of ids per sentence, got Tensor"),
    (lambda *a: padded_tensor(*a).tolist(), "padding or </s> ids"),
    (mask_as_target_padding, "raised ValueError.*memory_key_padding_mask, the 5th argument"),
    (lambda m, s, k, b, e, n: reference_greedy(m, s, k, b, e, n)[:-1], "one list of ids per sentence"),
])
def test_greedy_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_greedy_decode(wrong)


@pytest.mark.parametrize("wrong,message", [
    (lambda log_p, length, alpha: log_p / length_penalty(length, alpha), "without calling the course's length_penalty"),
    (lambda log_p, length, alpha: log_p / ((5 + length) ** alpha / 6), "exponent α applies to the whole fraction"),
    (lambda log_p, length, alpha: log_p / (5 + length / 6) ** alpha, "mind the parentheses"),
    (lambda log_p, length, alpha: {(-0.5, 1): -0.5}.get((log_p, length), log_p / ((5 + length) / 6) ** 0.6),
     "expected"),
])
def test_score_more_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_length_normalised_score(wrong)


@pytest.mark.parametrize("wrong,message", [
    (lambda *args: greedy_decode(*args), "without the course's greedy_decode"),
    (lambda *args: greedy_decode(*args, use_cache=False), "without the course's greedy_decode"),
    (lambda *a: reference_greedy(*a, strip=False, stop="never"), "never stops at </s>"),
    (lambda *a: reference_greedy(*a, strip="drop ids", stop="never"), "ran all max_len steps and removed the </s> ids"),
])
def test_greedy_more_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_greedy_decode(wrong)


@pytest.mark.parametrize("wrong,message", [
    (lambda log_p, length, alpha: log_p / ((5 + length) / 6 ** alpha), "not \\(5 \\+ \\|Y\\|\\) / 6\\^α"),
    (lambda log_p, length, alpha: log_p / ((6 + length) / 6) ** alpha, "adds 5 to the length, you added 6"),
    (lambda log_p, length, alpha: log_p / ((5 + length) // 6) ** alpha, "integer division"),
])
def test_score_named_beyond_the_issue(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_length_normalised_score(wrong)


@torch.no_grad()
def sampled_greedy(model, src, mask, bos_id, eos_id, max_len):
    memory = model.encode(src, mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    for _ in range(max_len):
        hidden = model.decode(ys, memory, subsequent_mask(ys.size(1)), None, mask)
        ys = torch.cat([ys, torch.multinomial(model.generator(hidden[:, -1]).float().softmax(-1), 1)], dim=1)
        if (ys == eos_id).any(dim=1).all():
            break
    return [r[:r.index(eos_id)] if eos_id in r else r for r in ys[:, 1:].tolist()]


@torch.no_grad()
def cut_at_last_eos(model, src, mask, bos_id, eos_id, max_len):
    rows = reference_greedy(model, src, mask, bos_id, eos_id, max_len, strip=False)
    return [r[:len(r) - 1 - r[::-1].index(eos_id)] if eos_id in r else r for r in rows]


@pytest.mark.parametrize("wrong,message", [
    (sampled_greedy, "two calls gave different outputs|expected"),
    (cut_at_last_eos, "cut at its FIRST </s>"),
])
def test_greedy_named_beyond_the_issue(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_greedy_decode(wrong)


def test_score_with_a_complex_power_is_named():
    with pytest.raises(AssertionError, match="expected|complex"):
        check_length_normalised_score(lambda lp, L, a: (lp / ((5 + L) / 6)) ** a)
