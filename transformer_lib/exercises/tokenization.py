"""Checkers for the exercises of notebook 01 (tokenization).

Hand-written, not exported: see `transformer_lib.exercises`. The checkers run the learner's code on
short sentences like the course corpus's (some with capitals and odd spacing) and compare it with
what a word-level tokenizer and the `Metaspace` decoder of `transformer_lib.tokenization` must give.
"""
from collections import Counter

from tokenizers import Tokenizer, decoders

from transformer_lib.exercises import Refuse, call, fresh_random, run_checker
from transformer_lib.tokenization import SubwordTokenizer

_BY_HAND = ("the exercise asks for the Metaspace decoder by hand; tokenizers' decoders (and a tokenizer's decode) "
            "are what it rebuilds: join the pieces and turn each ▁ into a space yourself")
_NO_DECODER = [Refuse((decoders.Decoder, "decode"), _BY_HAND), Refuse((Tokenizer, "decode"), _BY_HAND),
               Refuse((Tokenizer, "decode_batch"), _BY_HAND), Refuse((SubwordTokenizer, "decode"), _BY_HAND)]

_TRAIN = ["the cat chased a dog", "la miro la vaskon casis", "a dog will rest", "The cat rested"]  # The ≠ the


def _random_texts(rng) -> list[str]:
    """3 to 6 sentences of made-up words, so that no table of the fixed sentences passes."""
    words = ["".join(rng.choice("aeiklmnorstuv") for _ in range(rng.randint(1, 6))) for _ in range(12)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 7))) for _ in range(rng.randint(3, 6))]


_SPACED = ["the  cat\tchased\na dog ", "\ta dog  will   rest"]   # runs of spaces, tabs, newlines, edges


def _check_word_tokenizer(tokenizer_class) -> None:
    _check_own_vocabulary(tokenizer_class)
    _check_tokenizer_on(tokenizer_class, _TRAIN, "the kitten chased a fox")
    _check_whitespace(tokenizer_class)
    _check_tokenizer_on(tokenizer_class, _random_texts(fresh_random()), None)


def _probe(tokenizer, text: str):
    """`tokenizer.encode(text)` as a list, or None where it raises or returns something else (another check names
    that; a probe only compares two tokenizers)."""
    try:
        ids = tokenizer.encode(text)
    except Exception:
        return None
    return ids if isinstance(ids, list) else None


_OWN_A, _OWN_B, _NEVER = ["red fox runs", "a red hen"], ["blue owl sleeps", "an owl"], "zzqqz"


def _check_own_vocabulary(tokenizer_class) -> None:
    """Two tokenizers built from texts with different words: each must know only its own texts' words. A
    vocabulary kept where all instances share it (a class attribute, a global, a mutable default argument) gives
    the second the first one's words, or changes the first one's ids when the second is built."""
    first = call(tokenizer_class, list(_OWN_A), on=f"building {tokenizer_class.__name__}({_OWN_A})")
    before = _probe(first, _OWN_A[0])
    second = call(tokenizer_class, list(_OWN_B), on=f"building a second {tokenizer_class.__name__}({_OWN_B}) "
                  f"after a first one from {_OWN_A}")
    share = ("its vocabulary is shared by every instance of the class (a dict defined in the class body or at module "
             "level, or a mutable default argument such as vocab={}): create it in __init__, on self "
             "(self.word_to_id = {...})")
    unseen = _probe(second, _NEVER)
    for word in ("fox", "hen"):
        ids = _probe(second, word)
        if ids is not None and unseen is not None and ids != unseen:
            raise AssertionError(f"a {tokenizer_class.__name__} built from {_OWN_B} encodes {word!r}, a word of "
                                 f"ANOTHER tokenizer's texts {_OWN_A}, as {ids}, while a word never seen gives "
                                 f"{unseen}: {share}")
    after = _probe(first, _OWN_A[0])
    if before is not None and after is not None and before != after:
        raise AssertionError(f"building a second {tokenizer_class.__name__} (from {_OWN_B}) changed what the first "
                             f"one (from {_OWN_A}) gives for {_OWN_A[0]!r}: {before} before, {after} after; {share}")


def _check_whitespace(tokenizer_class) -> None:
    """The statement splits on whitespace (text.split()): several spaces, a tab or a newline separate words too."""
    tokenizer = call(tokenizer_class, list(_SPACED), on=f"building {tokenizer_class.__name__}(texts) from texts with "
                     f"several spaces in a row, tabs and newlines {_SPACED}")
    words = sorted({word for text in _SPACED for word in text.split()})
    by_space = sorted({word for text in _SPACED for word in text.split(" ")})          # the split(" ") slip
    for text in _SPACED + ["dog\tthe\n\ncat  rest"]:
        ids = call(tokenizer.encode, text, on=f"encoding {text!r}")
        expected = [words.index(word) + 1 for word in text.split()]
        if ids == expected:
            continue
        if any(ids == [vocabulary.index(word) + 1 if word in vocabulary else 0 for word in text.split(" ")]
               for vocabulary in (by_space, words)):
            raise AssertionError(f"encode({text!r}) gave {ids}, expected {expected}: you split on ' ' (split(' ')), "
                                 "which keeps an empty word '' between two spaces and does not split at a tab or a "
                                 "newline; split on any whitespace, text.split() with no argument")
        single = call(tokenizer.encode, " ".join(text.split()), on=f"encoding {' '.join(text.split())!r}")
        if single == expected or (isinstance(ids, list) and len(ids) != len(expected)):
            raise AssertionError(f"encode({text!r}) gave {ids}, expected {expected}" + (
                f" (with single spaces, {' '.join(text.split())!r}, you give the right ids)" if single == expected
                else f": {len(ids)} ids for {len(expected)} words") + ": words are separated by any whitespace, "
                "several spaces, tabs and newlines included (text.split())")
        raise AssertionError(f"encode({text!r}) gave {ids}, expected {expected} for a tokenizer built from "
                             f"{_SPACED}: the known words numbered 1, 2, ... in sorted order, 0 for a word never seen")
    text = _SPACED[0]
    expected = [words.index(word) + 1 for word in text.split()]
    decoded = call(tokenizer.decode, expected, on=f"decoding {expected}, the ids of {text!r}")
    assert decoded == " ".join(text.split()), (f"decode({expected}) gave {decoded!r}, expected "
                                               f"{' '.join(text.split())!r}: the words joined by single spaces")


def _check_tokenizer_on(tokenizer_class, train: list[str], unknown_text: str | None) -> None:
    tokenizer = call(tokenizer_class, list(train), on=f"building {tokenizer_class.__name__}(texts) from "
                     f"{len(train)} sentences {train}")
    words = sorted({word for text in train for word in text.split()})
    single = {w: call(tokenizer.encode, w, on=f"encoding the training word {w!r}", hint=lambda e: (
        "every word of every training text needs an id" if isinstance(e, KeyError) else None)) for w in words}
    missing = [w for w, ids in single.items() if ids == [0]]
    if sorted(ids[0] for ids in single.values() if isinstance(ids, list) and ids) == list(range(len(words))):
        raise AssertionError(f"the known words got the ids 0 .. {len(words) - 1}, but id 0 is <unk>: number the "
                             "known words from 1 (enumerate(words, start=1))")
    if missing and len(missing) < len(words):
        raise AssertionError(f"the training words {missing} got id 0 (<unk>): the vocabulary must hold every word of "
                             f"EVERY text in texts {train} (collect them all before numbering)")
    for text in train:
        ids = call(tokenizer.encode, text, on=f"encoding the training sentence {text!r}", hint=lambda e: (
            "every training word needs an id" if isinstance(e, KeyError) else None))
        assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), \
            f"encode must return a list of ints, got {ids!r}"
        assert len(ids) == len(text.split()), f"encode({text!r}) must give one id per word, got {ids}"
        assert 0 not in ids, (f"id 0 is <unk>, but encode({text!r}) = {ids} uses it for a known word: number "
                              "the known words from 1 (enumerate(words, start=1))")
        decoded = call(tokenizer.decode, ids, on=f"decoding {ids}, the ids of {text!r}", hint=lambda e: (
            "id i is the i-th known word counting from 1 (id 0 is <unk>): keep '<unk>' at index 0 of your list "
            "of words" if isinstance(e, (IndexError, KeyError)) else None))
        assert isinstance(decoded, str), f"decode must return the text, a str, got {type(decoded).__name__} {decoded!r}"
        if decoded != text and decoded.split() == text.lower().split():
            raise AssertionError(f"decode(encode({text!r})) gave {decoded!r}: you lower-cased the words. Words are "
                                 "split on spaces and kept as they are, so 'The' and 'the' are two words with "
                                 "two ids")
        if decoded != text and isinstance(decoded, str) and decoded.split() != text.split():
            shifted = [words[i % len(words)] if 0 < i <= len(words) else "?" for i in ids]   # ids read one too high
            if " ".join(shifted) == decoded:
                raise AssertionError(f"decode({ids}) gave {decoded!r}: off by one, id i is the i-th word counting "
                                     "from 1 (id 0 is <unk>), so keep '<unk>' at index 0 of your list of words")
        assert decoded == text, (f"decode(encode({text!r})) gave {decoded!r}: join the words with single spaces"
                                 if isinstance(decoded, str) and decoded.replace(" ", "") == text.replace(" ", "") else
                                 f"decode(encode({text!r})) gave {decoded!r}, not the text back")
    ids = {word: call(tokenizer.encode, word, on=f"encoding the single word {word!r}")[0] for word in words}
    assert len(set(ids.values())) == len(words), f"different words must get different ids, got {ids}"
    assert sorted(ids.values()) == list(range(1, len(words) + 1)), (
        f"the {len(words)} known words should have the ids 1 .. {len(words)} (0 is <unk>), got {sorted(ids.values())}")
    if [ids[word] for word in words] != list(range(1, len(words) + 1)):
        raise AssertionError(f"number the words in sorted order (sorted(set(words))){_order_named(ids, train)}: "
                             f"expected {dict(zip(words, range(1, len(words) + 1)))}, got {ids}")
    unknown_text = unknown_text or f"{words[0]} qqq {words[-1]} zzzz"
    unseen = [w for w in unknown_text.split() if w not in words]
    unknown = call(tokenizer.encode, unknown_text, on=f"encoding {unknown_text!r}, whose words {unseen} were never "
                   "seen", hint=lambda e: ("map a word never seen in training to <unk>, id 0 (dict.get(word, 0))"
                                           if isinstance(e, KeyError) else None))
    expected = [ids.get(w, 0) for w in unknown_text.split()]
    assert isinstance(unknown, list) and len(unknown) == len(expected), (
        f"encode({unknown_text!r}) gave {unknown}: one id per word, and a word never seen gets id 0 (<unk>), "
        "it is not left out")
    assert [unknown[i] for i, w in enumerate(unknown_text.split()) if w in unseen] == [0] * len(unseen), \
        f"unseen words must get id 0 (<unk>): encode({unknown_text!r}) gave {unknown}"
    assert unknown == expected, f"known words must keep their ids: encode({unknown_text!r}) gave {unknown}, expected {expected}"
    decoded = call(tokenizer.decode, unknown, on=f"decoding {unknown}, which holds id 0 (<unk>)")
    with_unk = " ".join(w if w in words else "<unk>" for w in unknown_text.split())
    assert decoded == with_unk, f"decode must write id 0 as <unk>: got {decoded!r}, expected {with_unk!r}"


def _order_named(ids: dict[str, int], train: list[str]) -> str:
    """", not in <the order the learner's ids follow>", or "" where no usual order explains them."""
    in_text = [word for text in train for word in text.split()]
    counts = Counter(in_text)
    orders = {"the order they first appear": list(dict.fromkeys(in_text)),
              "the order of their frequency (Counter.most_common)": [word for word, _ in counts.most_common()],
              "reverse sorted order": sorted(counts, reverse=True),
              "sorted order ignoring case (key=str.lower)": sorted(counts, key=str.lower),
              "the order of their length": sorted(counts, key=len)}
    given = sorted(ids, key=ids.get)
    return next((f", not in {name}" for name, order in orders.items() if order == given and order != sorted(counts)),
                "")


def check_word_tokenizer(tokenizer_class) -> None:
    """`WordTokenizer(texts)` with `encode(text) -> ids` and `decode(ids) -> text`; id 0 is `<unk>`."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("a word-level tokenizer with <unk>", tokenizer_class, _check_word_tokenizer)


_PIECES = [
    (["▁la", "▁mir", "ojn", "▁cas", "is"], "la mirojn casis"),
    (["▁the", "▁k", "it", "t", "en", "▁", "j", "u", "mp", "ed"], "the kitten jumped"),
    (["▁pilo"], "pilo"),
    (["▁a", "▁brave", "▁bird"], "a brave bird"),
    ([], ""),
    (["▁a", "▁", "▁b"], "a  b"),                        # a lone ▁ is a space of its own
    (["mir", "ojn", "▁la"], "mirojn la"),               # no ▁ in front: nothing to drop at the start
    (["▁", "▁la"], " la"),                              # a lone ▁ first: its space is dropped, the next one kept
    (["▁la", "▁"], "la "),                              # a lone ▁ last: a trailing space
    (["▁", "▁"], " "),
]


def _random_pieces(rng) -> tuple[list[str], str]:
    """A text of made-up words cut into pieces at random places, each word's first piece marked with ▁."""
    words = ["".join(rng.choice("aeiklmnorstuvĝ") for _ in range(rng.randint(1, 8))) for _ in range(rng.randint(1, 6))]
    pieces = []
    for word in words:
        cuts = sorted(rng.sample(range(1, len(word)), rng.randint(0, len(word) - 1))) if len(word) > 1 else []
        parts = [word[a:b] for a, b in zip([0] + cuts, cuts + [len(word)])]
        pieces += ["▁" + parts[0]] + parts[1:]
    return pieces, " ".join(words)


def _check_join_pieces(join_pieces) -> None:
    rng = fresh_random()
    for pieces, text in _PIECES + [_random_pieces(rng) for _ in range(3)]:
        got = call(join_pieces, list(pieces), on=f"joining {pieces}" + (" (an empty text)" if not pieces else ""),
                   refuse=_NO_DECODER, hint=lambda e: (
                       "the first piece has no ▁, so it starts the text without a space (tokenizer.decode gives "
                       f"{text!r}): do not assume a word before it" if pieces and not pieces[0].startswith("▁")
                       and isinstance(e, (IndexError, KeyError)) else None))
        assert isinstance(got, str), f"join_pieces must return a str, got {type(got).__name__}"
        if got == text:
            continue
        if got == " " + text:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: the ▁ of the first word marks the start of "
                                 "the text, not a space to keep; drop the leading space")
        if "▁" in got:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: every ▁ must become a space")
        if got == text.strip() or " ".join(got.split()) == " ".join(text.split()) and got != text:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}, expected {text!r}: keep every space a ▁ stands "
                                 "for (a lone ▁ is a space too); drop only ONE leading space, and only if the first "
                                 "piece starts with ▁")
        if got == text.replace(" ", "") and got != text:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: you removed the ▁ but it stands for the space "
                                 "before a word; replace it by a space, then drop the first one")
        if got.split() == [p.lstrip("▁") for p in pieces if p.lstrip("▁")] and got != text:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: a piece without ▁ continues the word "
                                 "before it, so glue the pieces together without spaces")
        if got == text[1:] or got == text[:-1]:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: a letter was cut; drop only a leading "
                                 "space, and only if there is one" + (" (here the first piece has no ▁, so the text "
                                                                     "starts with a letter)" if pieces and not
                                                                     pieces[0].startswith("▁") else ""))
        assert got == text, f"join_pieces({pieces}) gave {got!r}, expected {text!r}"


def check_join_pieces(join_pieces) -> None:
    """`join_pieces(tokens)`: the Metaspace decoder by hand, `["▁la", "▁mir", "ojn"]` -> `"la mirojn"`."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("the Metaspace decoder by hand", join_pieces, _check_join_pieces)
