"""Checkers for the exercises of notebook 01 (tokenization).

Hand-written, not exported: see `transformer_lib.exercises`. The checkers run the learner's code on
sentences of the course corpus and compare it with what a word-level tokenizer and the `Metaspace`
decoder of `transformer_lib.tokenization` must give.
"""
from transformer_lib.exercises import run_checker

_TRAIN = ["the cat chased a dog", "la miro la vaskon casis", "a dog will rest", "the cat rested"]


def _check_word_tokenizer(tokenizer_class) -> None:
    tokenizer = tokenizer_class(_TRAIN)
    words = sorted({word for text in _TRAIN for word in text.split()})
    for text in _TRAIN:
        try:
            ids = tokenizer.encode(text)
        except KeyError as error:
            raise AssertionError(f"encode({text!r}) raised KeyError {error}: every training word needs an id") from error
        assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), \
            f"encode must return a list of ints, got {ids!r}"
        assert len(ids) == len(text.split()), f"encode({text!r}) must give one id per word, got {ids}"
        assert 0 not in ids, f"id 0 is <unk>, but encode({text!r}) = {ids} uses it for a known word"
        decoded = tokenizer.decode(ids)
        assert decoded == text, (f"decode(encode({text!r})) gave {decoded!r}: join the words with single spaces"
                                 if decoded.replace(" ", "") == text.replace(" ", "") else
                                 f"decode(encode({text!r})) gave {decoded!r}, not the text back")
    ids = {word: tokenizer.encode(word)[0] for word in words}
    assert len(set(ids.values())) == len(words), f"different words must get different ids, got {ids}"
    assert sorted(ids.values()) == list(range(1, len(words) + 1)), (
        f"the {len(words)} known words should have the ids 1 .. {len(words)} (0 is <unk>), got {sorted(ids.values())}")
    try:
        unknown = tokenizer.encode("the kitten chased a fox")
    except KeyError as error:
        raise AssertionError(f"a word never seen in training raised KeyError {error}: map it to <unk>, id 0 "
                             "(dict.get(word, 0))") from error
    assert unknown[1] == 0 and unknown[4] == 0, f"unseen words must get id 0 (<unk>), got {unknown}"
    assert unknown[0] == ids["the"], f"'the' must keep its id {ids['the']}, got {unknown[0]}"
    decoded = tokenizer.decode(unknown)
    assert decoded == "the <unk> chased a <unk>", f"decode must write id 0 as <unk>: got {decoded!r}"


def check_word_tokenizer(tokenizer_class) -> bool:
    """`WordTokenizer(texts)` with `encode(text) -> ids` and `decode(ids) -> text`; id 0 is `<unk>`."""
    return run_checker("a word-level tokenizer with <unk>", tokenizer_class, _check_word_tokenizer)


_PIECES = [
    (["▁la", "▁mir", "ojn", "▁cas", "is"], "la mirojn casis"),
    (["▁the", "▁k", "it", "t", "en", "▁", "j", "u", "mp", "ed"], "the kitten jumped"),
    (["▁pilo"], "pilo"),
    (["▁a", "▁brave", "▁bird"], "a brave bird"),
]


def _check_join_pieces(join_pieces) -> None:
    for pieces, text in _PIECES:
        got = join_pieces(list(pieces))
        assert isinstance(got, str), f"join_pieces must return a str, got {type(got).__name__}"
        if got == " " + text:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: the ▁ of the first word marks the start of "
                                 "the text, not a space to keep; drop the leading space")
        if "▁" in got:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: every ▁ must become a space")
        if got.split() == [p.lstrip("▁") for p in pieces if p.lstrip("▁")] and got != text:
            raise AssertionError(f"join_pieces({pieces}) gave {got!r}: a piece without ▁ continues the word "
                                 "before it, so glue the pieces together without spaces")
        assert got == text, f"join_pieces({pieces}) gave {got!r}, expected {text!r}"


def check_join_pieces(join_pieces) -> bool:
    """`join_pieces(tokens)`: the Metaspace decoder by hand, `["▁la", "▁mir", "ojn"]` -> `"la mirojn"`."""
    return run_checker("the Metaspace decoder by hand", join_pieces, _check_join_pieces)
