"""The checkers of notebook 13's coding exercises: an unfilled stub, plausible wrong answers, right answers."""
import contextlib
import io
import math
from collections import Counter

import pytest
import torch

from transformer_lib.exercises.evaluation import check_brevity_penalty, check_ngram_precision


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



def brevity_penalty(c, r):
    return 0.0 if c == 0 else 1.0 if c >= r else math.exp(1 - r / c)


@pytest.mark.parametrize("right", [
    brevity_penalty,
    lambda c, r: min(1.0, math.exp(1 - r / c)) if c > 0 else 0.0,
    lambda c, r: 1 if c > r else (math.exp(1 - r / c) if c else 0),
])
def test_brevity_penalty_right_answers(right):
    assert accepted(check_brevity_penalty, right)


@pytest.mark.parametrize("wrong,message", [
    (lambda c, r: torch.tensor(1 - r / c).exp().clamp(max=1.0) if c else torch.tensor(0.0),
     r"right values: return a number .* a tensor of shape \(\)"),
    # the crash: no guard for an empty candidate, named with its input
    (lambda c, r: 1.0 if c >= r else math.exp(1 - r / c),
     r"raised ZeroDivisionError \(.*\) when the candidate is empty \(c=0, r=5\): .*return 0.0 before dividing"),
    (lambda c, r: min(1.0, math.exp(1 - r / c)), "raised ZeroDivisionError .* candidate is empty"),
    (lambda c, r: [1.0], "return a number"),
    (lambda c, r: 0.0 if c == 0 else min(1.0, math.exp(1 - c / r)) if c < r else 1.0, "r over c"),
    (lambda c, r: 0.0 if c == 0 else 1.0 if c >= r else math.exp(1 - r // c), "r // c is integer division"),
    (lambda c, r: 0.0 if c == 0 else 1.0 if c >= r else 1 - r / c, "exponential is missing"),
    (lambda c, r: {(9, 10): 0.894839, (5, 10): 0.367879, (1, 7): 0.002479, (3, 30): 1.2341e-4}.get((c, r), 1.0 if c else 0.0), "expected"),
    (lambda c, r: 0.0 if c == 0 else math.exp(1 - r / c), "BP = 1 when c >= r"),
    (lambda c, r: 1.0 if c >= r else math.exp(1 - r / max(c, 1e-9)) if c else 1.0, "return 0.0|wrong for an empty output"),
    (lambda c, r: 0.0 if c == 0 else 1.0 if c >= r else math.exp(-r / c), "the 1 is missing in the exponent"),
])
def test_brevity_penalty_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_brevity_penalty(wrong)


def ngrams(words, n):
    return Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def ngram_precision(hypothesis, reference, n):
    hyp, ref = ngrams(hypothesis, n), ngrams(reference, n)
    return sum(min(k, ref[g]) for g, k in hyp.items()), sum(hyp.values())


def ngram_precision_loops(hypothesis, reference, n):
    """Another right answer: lists and remove(), no Counter."""
    available = [tuple(reference[i:i + n]) for i in range(len(reference) - n + 1)]
    grams = [tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1)]
    matches = 0
    for gram in grams:
        if gram in available:
            available.remove(gram)
            matches += 1
    return matches, len(grams)


@pytest.mark.parametrize("right", [ngram_precision, ngram_precision_loops])
def test_ngram_precision_right_answers(right):
    assert accepted(check_ngram_precision, right)


def missing_last(words, n):
    return Counter(tuple(words[i:i + n]) for i in range(len(words) - n))


@pytest.mark.parametrize("wrong,message", [
    (lambda h, r, n: (sum(min(k, missing_last(r, n)[g]) for g, k in missing_last(h, n).items()),
                      sum(missing_last(h, n).values())), "last n-gram is missing"),
    (lambda h, r, n: (sum(max(k, ngrams(r, n)[g]) for g, k in ngrams(h, n).items() if g in ngrams(r, n)),
                      sum(ngrams(h, n).values())), "Clip"),
    (lambda h, r, n: [*ngram_precision(h, r, n)], "return a tuple"),
    (lambda h, r, n: (ngram_precision(h, r, n)[0] / max(ngram_precision(h, r, n)[1], 1), 1), "expected"),
    (lambda h, r, n: ngram_precision(" ".join(h), r, n), "expected"),
    (lambda h, r, n: (sum(k for g, k in ngrams(h, n).items() if g in ngrams(r, n)), sum(ngrams(h, n).values())),
     "Clip"),
    (lambda h, r, n: (len(set(ngrams(h, n)) & set(ngrams(r, n))), sum(ngrams(h, n).values())), "Counter"),
    (lambda h, r, n: (ngram_precision(h, r, n)[0], sum(ngrams(r, n).values())), "not the reference's"),
])
def test_ngram_precision_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_ngram_precision(wrong)


def test_brevity_penalty_refuses_sacrebleu():
    def via_sacrebleu(c, r):
        import sacrebleu
        return sacrebleu.corpus_bleu([" ".join(["w"] * c)], [[" ".join(["w"] * r)]], tokenize="none").bp

    with pytest.raises(AssertionError, match="compute it yourself"):
        check_brevity_penalty(via_sacrebleu)


def test_ngram_precision_refuses_sacrebleu_and_reads_an_empty_hypothesis():
    def via_sacrebleu(hypothesis, reference, n):
        import sacrebleu
        score = sacrebleu.corpus_bleu([" ".join(hypothesis)], [[" ".join(reference)]], tokenize="none")
        return score.counts[n - 1], score.totals[n - 1]

    with pytest.raises(AssertionError, match="compute it yourself"):
        check_ngram_precision(via_sacrebleu)

    def crashes_on_empty(hypothesis, reference, n):
        grams = [tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1)]
        ref = [tuple(reference[i:i + n]) for i in range(len(reference) - n + 1)]
        return sum(min(grams.count(g), ref.count(g)) for g in set(grams)), len(grams) // (len(hypothesis) > 0)

    with pytest.raises(AssertionError, match="ZeroDivisionError.*an empty hypothesis"):
        check_ngram_precision(crashes_on_empty)


def test_ngram_with_a_repeated_word_is_counted():
    def skips_repeats(hypothesis, reference, n):
        grams = [tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1)]
        ref = [tuple(reference[i:i + n]) for i in range(len(reference) - n + 1)]
        matches = sum(min(grams.count(g), ref.count(g)) for g in set(grams) if n == 1 or len(set(g)) > 1)
        return matches, len(grams)

    with pytest.raises(AssertionError, match="the the cat"):
        check_ngram_precision(skips_repeats)


# ---------------------------------------------------------------- fresh4: totals
@pytest.mark.parametrize("wrong, message", [
    (lambda h, r, n: (ngram_precision(h, r, n)[0], len(h) - n + 1), "The total went negative: .* max\\(0, "),
    (lambda h, r, n: (ngram_precision(h, r, n)[0], len(h)), "Your total is the number of WORDS"),
])
def test_ngram_precision_totals_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_ngram_precision(wrong)
