"""The checkers of notebook 13's coding exercises: an unfilled stub, plausible wrong answers, right answers."""
import math
from collections import Counter

import pytest

from transformer_lib.exercises.evaluation import check_brevity_penalty, check_ngram_precision


def brevity_penalty(c, r):
    return 0.0 if c == 0 else 1.0 if c >= r else math.exp(1 - r / c)


def test_brevity_penalty_right_answer(capsys):
    assert check_brevity_penalty(brevity_penalty)
    assert "correct: brevity penalty" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,message", [
    (lambda c, r: 0.0 if c == 0 else min(1.0, math.exp(1 - c / r)) if c < r else 1.0, "r over c"),
    (lambda c, r: 0.0 if c == 0 else math.exp(1 - r / c), "BP = 1 when c >= r"),
    (lambda c, r: 1.0 if c >= r else math.exp(1 - r / max(c, 1e-9)) if c else 1.0, "return 0.0"),
    (lambda c, r: 0.0 if c == 0 else 1.0 if c >= r else math.exp(-r / c), "expected exp"),
])
def test_brevity_penalty_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_brevity_penalty(wrong)


def ngrams(words, n):
    return Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def ngram_precision(hypothesis, reference, n):
    hyp, ref = ngrams(hypothesis, n), ngrams(reference, n)
    return sum(min(k, ref[g]) for g, k in hyp.items()), sum(hyp.values())


def test_ngram_precision_right_answer(capsys):
    assert check_ngram_precision(ngram_precision)
    assert "correct: modified n-gram precision" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,message", [
    (lambda h, r, n: (sum(k for g, k in ngrams(h, n).items() if g in ngrams(r, n)), sum(ngrams(h, n).values())),
     "Clip"),
    (lambda h, r, n: (len(set(ngrams(h, n)) & set(ngrams(r, n))), sum(ngrams(h, n).values())), "Counter"),
    (lambda h, r, n: (ngram_precision(h, r, n)[0], sum(ngrams(r, n).values())), "not the reference's"),
])
def test_ngram_precision_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_ngram_precision(wrong)
