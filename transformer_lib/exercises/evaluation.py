"""Checkers for the coding exercises of notebook 13 (evaluation). Hand-written, not exported.

Both compare the learner's function with sacreBLEU itself, on texts that sacreBLEU does not
re-tokenize (`tokenize="none"`: words are split on spaces):

* `check_brevity_penalty`: BLEU's brevity penalty BP = min(1, exp(1 - r / c)).
* `check_ngram_precision`: the clipped ("modified") n-gram matches and the n-gram total of one
  hypothesis, the numbers BLEU's p_n is made of.
"""
import collections
import math

import sacrebleu
from sacrebleu.metrics import helpers
from sacrebleu.metrics.base import Metric
from sacrebleu.metrics.bleu import BLEU

from transformer_lib.exercises import Refuse, call, fresh_random, run_checker
from transformer_lib.exercises.explain import is_int, is_number, number_expected, regime, what_it_is
from transformer_lib.exercises.guards import isclose

_YOURSELF = "compute it yourself: sacreBLEU is what the checker compares your function with"
_NO_SACREBLEU = [Refuse((Metric, "corpus_score"), _YOURSELF), Refuse((Metric, "sentence_score"), _YOURSELF),
                 Refuse((BLEU, "sentence_score"), _YOURSELF), Refuse((BLEU, "compute_bleu"), _YOURSELF),
                 Refuse((BLEU, "_compute_score_from_stats"), _YOURSELF),
                 Refuse((BLEU, "_compute_segment_statistics"), _YOURSELF),
                 Refuse(helpers.extract_all_word_ngrams, _YOURSELF), Refuse(helpers.extract_word_ngrams, _YOURSELF)]


def _sacrebleu(hypothesis: str, reference: str):
    return sacrebleu.corpus_bleu([hypothesis], [[reference]], tokenize="none")


_BP_SLIPS = {  # a slip that explains every answer for c > 0, and the message that names it
    "r // c is integer division (it drops the fraction); divide with /: exp(1 - r / c)":
        lambda c, r: 1.0 if c >= r else math.exp(1 - r // c),
    "you computed exp(1 - c / r); the penalty is exp(1 - r / c), r over c, which is below 1 when c < r":
        lambda c, r: 1.0 if c >= r else min(1.0, math.exp(1 - c / r)),
    "you computed exp(1 - c / r), which is above 1 when c < r; the penalty is exp(1 - r / c), r over c":
        lambda c, r: 1.0 if c >= r else math.exp(1 - c / r),
    "the exponential is missing: BP = exp(1 - r / c) when c < r": lambda c, r: 1.0 if c >= r else 1 - r / c,
    "the 1 is missing in the exponent: BP = exp(1 - r / c), not exp(-r / c)": lambda c, r: 1.0 if c >= r else math.exp(-r / c),
    "BP is not the length ratio c / r: a short output (c < r) gets exp(1 - r / c), which falls faster":
        lambda c, r: 1.0 if c >= r else c / r,
    "BP is not a length ratio: a short output (c < r) gets exp(1 - r / c), and an output at least as long as the "
    "references gets 1": lambda c, r: c / r,
    "that is 1 / exp(1 - r / c), above 1 for a short output; BP = exp(1 - r / c), below 1 when c < r":
        lambda c, r: 1.0 if c >= r else math.exp(r / c - 1),
    "the condition is the wrong way round: BP = 1 when the output is at least as long as the references (c >= r), "
    "exp(1 - r / c) when it is shorter": lambda c, r: math.exp(1 - r / c) if c >= r else 1.0,
}


def _check_bp(your_function) -> None:
    rng = fresh_random()
    drawn = [(rng.randint(1, 60), rng.randint(1, 60)) for _ in range(3)] + [(rng.randint(61, 90), rng.randint(91, 200))]
    answers, returned = {}, None
    for c, r in [(10, 10), (11, 10), (12, 10), (9, 10), (5, 10), (1, 7), (3, 30), (7, 20), (0, 5)] + drawn:
        got = call(your_function, c, r, on=f"the candidate is empty (c=0, r={r})" if c == 0 else f"c={c}, r={r}",
                   hint=("an empty output has BP = 0 (and BLEU 0): return 0.0 before dividing by c"
                         if c == 0 else None), refuse=_NO_SACREBLEU)
        assert isinstance(got, (int, float)) or (hasattr(got, "__float__") and getattr(got, "ndim", 0) == 0), \
            f"c={c}, r={r}: return a number, got {what_it_is(got)}"
        answers[c, r] = float(got)
        returned = got if not is_number(got) and returned is None else returned
    expected = {(c, r): _sacrebleu(" ".join(["w"] * c), " ".join(["w"] * r)).bp for c, r in answers}
    wrong = [(c, r) for c, r in answers if not isclose(answers[c, r], expected[c, r], rel_tol=1e-6, abs_tol=1e-9)]
    if not wrong:
        if returned is not None:
            number_expected(returned, "brevity_penalty has the right values")
        return
    for message, slip in _BP_SLIPS.items():
        if all(isclose(answers[c, r], slip(c, r), rel_tol=1e-6) for c, r in answers if c > 0):
            raise AssertionError(message)
    said = regime(list(answers), [(c, r) not in wrong for c, r in answers],
                  lambda case: "for an empty output (c = 0)" if case[0] == 0 else "for c >= r" if case[0] >= case[1]
                  else "for c < r")
    c, r = wrong[0]
    got, want = answers[c, r], expected[c, r]
    if said:
        raise AssertionError(f"your BP is {said} (first at c={c}, r={r}: expected {want:.6f}, got {got:.6f}): BP = 1 "
                             "when c >= r, exp(1 - r / c) when 0 < c < r, and 0 when c = 0")
    if c == 0:
        raise AssertionError(f"c=0, r={r}: expected 0.0, got {got}. An empty output has BP = 0 (and BLEU 0): "
                             f"return 0.0 before dividing by c")
    if c >= r:
        raise AssertionError(f"c={c}, r={r}: expected 1.0, got {got:.6f}. A hypothesis corpus at least as "
                             f"long as the references is not penalized: BP = 1 when c >= r")
    if got >= 1:
        raise AssertionError(f"c={c}, r={r}: expected {want:.6f}, got {got:.6f}. A short output (c < r) "
                             f"gets BP = exp(1 - r / c) < 1")
    raise AssertionError(f"c={c}, r={r}: expected exp(1 - r / c) = {want:.6f}, got {got:.6f}")


def check_brevity_penalty(your_function) -> None:
    """Check `your_function(c, r) -> BP` (c: hypothesis length, r: reference length, in words)."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("brevity penalty", your_function, _check_bp)


CASES = [("the the the the the the the", "the cat is on the mat"),        # Papineni et al.'s example
         ("the cat the cat on the mat", "the cat is on the mat the cat"),
         ("a dog chased the red ball", "a dog chased the red ball"),
         ("ball red the chased dog a", "a dog chased the red ball"),
         ("the mat", "the cat sat on the mat"),
         ("la la la kampo la", "la kampo la kampo"),
         ("", "the cat sat"),
         ("the the cat", "the the cat sat"),                                # a repeated word inside an n-gram
         ("The cat saw the Cat", "the cat saw The cat"),                    # BLEU is cased: The ≠ the
         ("cat the on mat the", "the cat on the mat"),                      # the right words in another order
         ("a tall man", "at all man")]                                      # ('a', 'tall') ≠ ('at', 'all')


def _fresh_cases() -> list[tuple[str, str]]:
    rng = fresh_random()
    words = ["la", "kampo", "the", "cat", "mat", "on", "a", "dog"][:rng.randint(3, 8)]
    return [(" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))),
             " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))) for _ in range(3)]


def _check_precision(your_function) -> None:
    results, odd = [], None                          # (hypothesis, reference, n, expected, got)
    for hypothesis, reference in CASES + _fresh_cases():
        scores = _sacrebleu(hypothesis, reference)
        for n in (1, 2, 3, 4):
            got = call(your_function, hypothesis.split(), reference.split(), n, refuse=_NO_SACREBLEU,
                       on=f"n={n}, hypothesis {hypothesis!r}, reference {reference!r}" + (
                           " (shorter than n words)" if len(hypothesis.split()) < n else "")
                       + (" (an empty hypothesis)" if not hypothesis else ""))
            assert isinstance(got, tuple) and len(got) == 2, \
                f"return a tuple (matches, total), got {what_it_is(got)}"
            results.append((hypothesis, reference, n, (scores.counts[n - 1], scores.totals[n - 1]),
                            (int(got[0]), int(got[1]))))
            odd = odd if odd is not None else next((value for value in got if not is_int(value)), None)
    wrong = [result for result in results if result[3] != result[4]]
    if not wrong:
        if odd is not None:
            number_expected(odd, "ngram_precision has the right counts, but (matches, total) must be two ints",
                            kind="int")
        return
    hypothesis, reference, n, expected, got = wrong[0]
    where = f"n={n}, hypothesis {hypothesis!r}, reference {reference!r}: expected {expected}, got {got}."

    def totals_are(count, floor=0) -> bool:          # the totals follow `count(hypothesis words, reference words, n)`
        return all(g[1] == max(count(len(h.split()), len(r.split()), n), floor) for h, r, n, _, g in results)

    def matches_are(key) -> bool:                    # the matches follow n-grams keyed by `key` (a slip)
        return all(g[0] == _clipped(h.split(), r.split(), n, key) for h, r, n, _, g in results) and \
            any(e[0] != _clipped(h.split(), r.split(), n, key) for h, r, n, e, _ in results)

    if got[0] != expected[0] and (matches_are(lambda gram: tuple(sorted(gram))) or matches_are(frozenset)):
        hint = (" Your n-grams lost their word order (a set, frozenset or sorted tuple): 'cat the' is not 'the cat'."
                " Key each n-gram by the tuple of its words in order, tuple(words[i:i + n])")
    elif got[0] != expected[0] and matches_are("".join):
        hint = (" Your n-grams joined their words without a separator, so different n-grams became one key: "
                "('a', 'tall') and ('at', 'all') both give 'atall'. Key each n-gram by the tuple of its words, "
                "tuple(words[i:i + n])")
    elif got[0] != expected[0] and all(g[0] == _reference_occurrences(h.split(), r.split(), n) for h, r, n, _, g in results):
        hint = (" You counted how often each hypothesis n-gram occurs in the REFERENCE; a match count is "
                "min(count in the hypothesis, count in the reference): 'the mat' against 'the cat sat on the mat' "
                "has 2 unigram matches, not 3")
    elif got[0] != expected[0] and matches_are(lambda gram: tuple(word.lower() for word in gram)):
        hint = (" You lower-cased the words; BLEU is cased here (sacreBLEU's default): 'The' and 'the' are different "
                "words")
    elif totals_are(lambda h, r, n: h - n + 1, floor=-math.inf):
        hint = (f" The total went negative: a hypothesis of {len(hypothesis.split())} words has no {n}-gram, so its "
                "total is 0, not len(hypothesis) − n + 1 < 0: max(0, len(hypothesis) − n + 1)")
    elif totals_are(lambda h, r, n: h):
        hint = (" Your total is the number of WORDS; it is the number of n-grams, len(hypothesis) − n + 1 (or 0 when "
                "the hypothesis is shorter than n)")
    elif totals_are(lambda h, r, n: r - n + 1) or totals_are(lambda h, r, n: r - n + 1, floor=-math.inf):
        hint = " The total counts the hypothesis' n-grams (len(hypothesis) - n + 1, or 0), not the reference's"
    elif totals_are(lambda h, r, n: h - n) or totals_are(lambda h, r, n: h - n, floor=-math.inf):
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


def _reference_occurrences(hypothesis: list[str], reference: list[str], n: int) -> int:
    """A slip: for each distinct hypothesis n-gram, its count in the reference (not clipped by the hypothesis')."""
    grams = lambda words: collections.Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))  # noqa: E731
    reference_grams = grams(reference)
    return sum(reference_grams[gram] for gram in grams(hypothesis))


def _clipped(hypothesis: list[str], reference: list[str], n: int, key) -> int:
    """Clipped matches with each n-gram keyed by `key(tuple of its words)`: the identity is right, others slips."""
    def grams(words):
        return collections.Counter(key(tuple(words[i:i + n])) for i in range(len(words) - n + 1))
    reference_grams = grams(reference)
    return sum(min(count, reference_grams[gram]) for gram, count in grams(hypothesis).items())


def check_ngram_precision(your_function) -> None:
    """Check `your_function(hypothesis_words, reference_words, n) -> (clipped matches, hypothesis n-grams)`."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("modified n-gram precision", your_function, _check_precision)
