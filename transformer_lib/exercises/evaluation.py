"""Checkers for the coding exercises of notebook 13 (evaluation). Hand-written, not exported.

Both compare the learner's function with sacreBLEU itself, on texts that sacreBLEU does not
re-tokenize (`tokenize="none"`: words are split on spaces):

* `check_brevity_penalty`: BLEU's brevity penalty BP = min(1, exp(1 - r / c)).
* `check_ngram_precision`: the clipped ("modified") n-gram matches and the n-gram total of one
  hypothesis, the numbers BLEU's p_n is made of.
"""
import math

import sacrebleu

from transformer_lib.exercises import call, run_checker


def _sacrebleu(hypothesis: str, reference: str):
    return sacrebleu.corpus_bleu([hypothesis], [[reference]], tokenize="none")


def _check_bp(your_function) -> None:
    for c, r in ((10, 10), (12, 10), (9, 10), (5, 10), (1, 7), (3, 30), (0, 5)):
        expected = _sacrebleu(" ".join(["w"] * c), " ".join(["w"] * r)).bp
        got = call(your_function, c, r, on=f"the candidate is empty (c=0, r={r})" if c == 0 else f"c={c}, r={r}",
                   hint=("an empty output has BP = 0 (and BLEU 0): return 0.0 before dividing by c"
                         if c == 0 else None))
        assert isinstance(got, (int, float)) or (hasattr(got, "__float__") and getattr(got, "ndim", 0) == 0), \
            f"c={c}, r={r}: return a number, got {type(got).__name__}"
        got = float(got)
        if math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9):
            continue
        if c == 0:
            raise AssertionError(f"c=0, r={r}: expected 0.0, got {got}. An empty output has BP = 0 (and BLEU 0): "
                                 f"return 0.0 before dividing by c")
        if c >= r:
            raise AssertionError(f"c={c}, r={r}: expected 1.0, got {got:.6f}. A hypothesis corpus at least as "
                                 f"long as the references is not penalized: BP = 1 when c >= r")
        if got >= 1:
            raise AssertionError(f"c={c}, r={r}: expected {expected:.6f}, got {got:.6f}. A short output (c < r) "
                                 f"gets BP = exp(1 - r / c) < 1 (r over c, not c over r)")
        raise AssertionError(f"c={c}, r={r}: expected exp(1 - r / c) = {expected:.6f}, got {got:.6f}")


def check_brevity_penalty(your_function) -> None:
    """Check `your_function(c, r) -> BP` (c: hypothesis length, r: reference length, in words)."""
    run_checker("brevity penalty", your_function, _check_bp)


CASES = [("the the the the the the the", "the cat is on the mat"),        # Papineni et al.'s example
         ("the cat the cat on the mat", "the cat is on the mat the cat"),
         ("a dog chased the red ball", "a dog chased the red ball"),
         ("ball red the chased dog a", "a dog chased the red ball"),
         ("the mat", "the cat sat on the mat"),
         ("la la la kampo la", "la kampo la kampo")]


def _check_precision(your_function) -> None:
    results = []                                     # (hypothesis, reference, n, expected, got)
    for hypothesis, reference in CASES:
        scores = _sacrebleu(hypothesis, reference)
        for n in (1, 2, 3, 4):
            got = call(your_function, hypothesis.split(), reference.split(), n,
                       on=f"n={n}, hypothesis {hypothesis!r}, reference {reference!r}" + (
                           " (shorter than n words)" if len(hypothesis.split()) < n else ""))
            assert isinstance(got, tuple) and len(got) == 2, "return a tuple (matches, total)"
            results.append((hypothesis, reference, n, (scores.counts[n - 1], scores.totals[n - 1]),
                            (int(got[0]), int(got[1]))))
    wrong = [result for result in results if result[3] != result[4]]
    if not wrong:
        return
    hypothesis, reference, n, expected, got = wrong[0]
    where = f"n={n}, hypothesis {hypothesis!r}, reference {reference!r}: expected {expected}, got {got}."

    def totals_are(count) -> bool:                   # the totals follow `count(hypothesis words, reference words, n)`
        return all(g[1] == max(count(len(h.split()), len(r.split()), n), 0) for h, r, n, _, g in results)

    if totals_are(lambda h, r, n: r - n + 1):
        hint = " The total counts the hypothesis' n-grams (len(hypothesis) - n + 1, or 0), not the reference's"
    elif totals_are(lambda h, r, n: h - n):
        hint = " The last n-gram is missing: a text of L words has L − n + 1 n-grams, range(len(words) - n + 1)"
    elif got[1] != expected[1]:
        hint = " The total is the number of n-grams in the hypothesis, repeats included"
    elif got[0] > expected[0]:
        hint = (" Clip: an n-gram is matched at most as often as it occurs in the reference "
                "(Papineni's 'the the the ...' against 'the cat is on the mat' has 2 unigram matches, not 7)")
    else:
        hint = (" Count repeated n-grams: a hypothesis n-gram that occurs k times matches min(k, its count "
                "in the reference) times (use collections.Counter, not a set)")
    raise AssertionError(where + hint)


def check_ngram_precision(your_function) -> None:
    """Check `your_function(hypothesis_words, reference_words, n) -> (clipped matches, hypothesis n-grams)`."""
    run_checker("modified n-gram precision", your_function, _check_precision)
