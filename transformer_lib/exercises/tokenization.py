"""Checkers for the exercises of notebook 01 (tokenization).

Hand-written, not exported: see `transformer_lib.exercises`. The checkers run the learner's code on
sentences of the course corpus and compare it with what a word-level tokenizer and the `Metaspace`
decoder of `transformer_lib.tokenization` must give.
"""
from transformer_lib.exercises import call, run_checker

_TRAIN = ["the cat chased a dog", "la miro la vaskon casis", "a dog will rest", "the cat rested"]


def _check_word_tokenizer(tokenizer_class) -> None:
    tokenizer = call(tokenizer_class, list(_TRAIN), on=f"building {tokenizer_class.__name__}(texts) from {len(_TRAIN)} "
                     "sentences")
    words = sorted({word for text in _TRAIN for word in text.split()})
    for text in _TRAIN:
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
    assert [ids[word] for word in words] == list(range(1, len(words) + 1)), (
        f"number the words in sorted order (sorted(set(words))), not in the order they first appear: "
        f"expected {dict(zip(words, range(1, len(words) + 1)))}, got {ids}")
    unknown = call(tokenizer.encode, "the kitten chased a fox", on="encoding 'the kitten chased a fox', whose words "
                   "'kitten' and 'fox' were never seen", hint=lambda e: (
                       "map a word never seen in training to <unk>, id 0 (dict.get(word, 0))"
                       if isinstance(e, KeyError) else None))
    assert unknown[1] == 0 and unknown[4] == 0, f"unseen words must get id 0 (<unk>), got {unknown}"
    assert unknown[0] == ids["the"], f"'the' must keep its id {ids['the']}, got {unknown[0]}"
    decoded = call(tokenizer.decode, unknown, on=f"decoding {unknown}, which holds id 0 (<unk>)")
    assert decoded == "the <unk> chased a <unk>", f"decode must write id 0 as <unk>: got {decoded!r}"


def check_word_tokenizer(tokenizer_class) -> None:
    """`WordTokenizer(texts)` with `encode(text) -> ids` and `decode(ids) -> text`; id 0 is `<unk>`."""
    run_checker("a word-level tokenizer with <unk>", tokenizer_class, _check_word_tokenizer)


_PIECES = [
    (["▁la", "▁mir", "ojn", "▁cas", "is"], "la mirojn casis"),
    (["▁the", "▁k", "it", "t", "en", "▁", "j", "u", "mp", "ed"], "the kitten jumped"),
    (["▁pilo"], "pilo"),
    (["▁a", "▁brave", "▁bird"], "a brave bird"),
    ([], ""),
]


def _check_join_pieces(join_pieces) -> None:
    for pieces, text in _PIECES:
        got = call(join_pieces, list(pieces), on=f"joining {pieces}" + (" (an empty text)" if not pieces else ""))
        assert isinstance(got, str), f"join_pieces must return a str, got {type(got).__name__}"
        if got == text:
            continue
        if got == " " + text:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: the ▁ of the first word marks the start of "
                                 "the text, not a space to keep; drop the leading space")
        if "▁" in got:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: every ▁ must become a space")
        if got == text.replace(" ", "") and got != text:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: you removed the ▁ but it stands for the space "
                                 "before a word; replace it by a space, then drop the first one")
        if got.split() == [p.lstrip("▁") for p in pieces if p.lstrip("▁")] and got != text:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: a piece without ▁ continues the word "
                                 "before it, so glue the pieces together without spaces")
        if got == text[1:] or got == text[:-1]:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: a letter was cut; drop only a leading "
                                 "space, and only if there is one")
        assert got == text, f"join_pieces({pieces}) gave {got!r}, expected {text!r}"


def check_join_pieces(join_pieces) -> None:
    """`join_pieces(tokens)`: the Metaspace decoder by hand, `["▁la", "▁mir", "ojn"]` -> `"la mirojn"`."""
    run_checker("the Metaspace decoder by hand", join_pieces, _check_join_pieces)
