"""The checkers of notebook 01's exercises: plausible slips -> a message that names them, right answers
(several ways of writing them) -> "correct". (Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
from collections import Counter

import pytest

from transformer_lib.exercises.tokenization import check_join_pieces, check_word_tokenizer


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1


class Word:
    unk = 0

    def __init__(self, texts):
        words = sorted({word for text in texts for word in text.split()})
        self.stoi = {word: i for i, word in enumerate(words, start=1)}
        self.itos = {i: word for word, i in self.stoi.items()} | {0: "<unk>"}

    def encode(self, text):
        return [self.stoi.get(word, self.unk) for word in text.split()]

    def decode(self, ids):
        return " ".join(self.itos[i] for i in ids)


class WordWithLists:
    """Another right answer: a list of words with <unk> first, and index() lookups."""

    def __init__(self, texts):
        self.words = ["<unk>"] + sorted(set(" ".join(texts).split()))

    def encode(self, text):
        return [self.words.index(w) if w in self.words[1:] else 0 for w in text.split()]

    def decode(self, ids):
        out = ""
        for i in ids:
            out += (" " if out else "") + self.words[i]
        return out


class NoUnk(Word):
    def encode(self, text):
        return [self.stoi[word] for word in text.split()]


class FromZero(Word):
    def __init__(self, texts):
        super().__init__(texts)
        self.stoi = {word: i - 1 for word, i in self.stoi.items()}
        self.itos = {i: word for word, i in self.stoi.items()}


class NoSpaces(Word):
    def decode(self, ids):
        return "".join(self.itos[i] for i in ids)


class FirstSeenOrder(Word):
    def __init__(self, texts):
        words = list(dict.fromkeys(word for text in texts for word in text.split()))
        self.stoi = {word: i for i, word in enumerate(words, start=1)}
        self.itos = {i: word for word, i in self.stoi.items()} | {0: "<unk>"}


class DecodeOffByOne(Word):
    def __init__(self, texts):
        super().__init__(texts)
        self.words = sorted(self.stoi)

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)                 # no <unk> at index 0


class UnkNotWritten(Word):
    def decode(self, ids):
        return " ".join(self.itos[i] for i in ids if i != 0)


class ReturnsTuple(Word):
    def encode(self, text):
        return tuple(super().encode(text))


@pytest.mark.parametrize("wrong, message", [
    (NoUnk, "KeyError.*map a word never seen in training to <unk>"),
    (FromZero, "id 0 is <unk>.*start=1"),
    (NoSpaces, "single spaces"),
    (FirstSeenOrder, "sorted order"),
    (DecodeOffByOne, "id i is the i-th known word counting from 1|off by one"),
    (UnkNotWritten, "write id 0 as <unk>"),
    (ReturnsTuple, "list of ints"),
])
def test_word_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_word_tokenizer(wrong)


@pytest.mark.parametrize("right", [Word, WordWithLists])
def test_word_right_answers(right):
    assert accepted(check_word_tokenizer, right)


def join(tokens):
    return "".join(tokens).replace("▁", " ")[1:]


def join_words(tokens):
    words = []
    for token in tokens:
        if token.startswith("▁"):
            words.append(token[1:])
        else:
            words[-1] += token
    return " ".join(words)


def join_index(tokens):
    text = "".join(tokens).replace("▁", " ")
    return text[1:] if text[:1] == " " else text


def join_first(tokens):
    return "".join(tokens)[1:].replace("▁", " ")          # crashes nothing on []: ""[1:] == ""


def join_crashes_on_empty(tokens):
    text = "".join(tokens).replace("▁", " ")
    if text[0] == " ":
        text = text[1:]
    return text


@pytest.mark.parametrize("wrong, message", [
    (lambda tokens: "".join(tokens).replace("▁", " "), "leading space"),
    (lambda tokens: "".join(tokens)[1:], "must become a space"),
    (lambda tokens: " ".join(t.lstrip("▁") for t in tokens if t.lstrip("▁")), "without spaces"),
    (lambda tokens: "".join(tokens).replace("▁", ""), "removed the ▁ but it stands for the space"),
    (lambda tokens: "".join(tokens).replace("▁", " ")[2:], "a letter was cut"),
    (join_crashes_on_empty, r"raised IndexError .* when joining \[\] \(an empty text\)"),
    (join, "a letter was cut.*the first piece has no ▁"),                  # drops character 0 unconditionally
    (join_first, "a letter was cut.*the first piece has no ▁"),
    (join_words, r"raised IndexError .* when joining \['mir', 'ojn', '▁la'\]: the first piece has no ▁"),
])
def test_join_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_join_pieces(wrong)


@pytest.mark.parametrize("right", [join_index, lambda tokens: "".join(tokens).replace("▁", " ").removeprefix(" ")])
def test_join_right_answers(right):
    assert accepted(check_join_pieces, right)


def test_join_agrees_with_the_course_tokenizer():
    from transformer_lib.tokenization import train_bpe_tokenizer
    texts = ["la miro la vaskon casis", "the kitten jumped", "a brave bird will rest"] * 3
    tokenizer = train_bpe_tokenizer(texts, vocab_size=60, min_frequency=1)
    for text in texts[:3]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert join([tokenizer.id_to_token(i) for i in ids]) == tokenizer.decode(ids) == text


class LastTextOnly(Word):
    """The vocabulary is rebuilt for every text, so only the last text's words are known."""

    def __init__(self, texts):
        for text in texts:
            super().__init__([text])


class SortsInPlace(Word):
    def __init__(self, texts):
        texts.sort()                                               # changes the caller's list
        super().__init__(texts)


class Memorised:
    """A table of the fixed sentences' ids: passes nothing the checker draws afresh."""
    table = {"the": 15, "cat": 3, "chased": 5, "a": 1, "dog": 6, "la": 9, "miro": 10, "vaskon": 14, "casis": 4,
             "will": 16, "rest": 12, "rested": 13}

    def __init__(self, texts):
        self.back = {i: w for w, i in self.table.items()} | {0: "<unk>"}

    def encode(self, text):
        return [self.table.get(w, 0) for w in text.split()]

    def decode(self, ids):
        return " ".join(self.back[i] for i in ids)


@pytest.mark.parametrize("wrong, message", [
    (LastTextOnly, "EVERY text"),
    (SortsInPlace, "changed its input `texts` in place"),
    (Memorised, "got id 0|ids 1 ..|KeyError|sorted order"),
])
def test_word_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_word_tokenizer(wrong)


def join_pop(tokens):
    text = ""
    while tokens:                                                  # empties the caller's list
        text += tokens.pop(0).replace("▁", " ")
    return text[1:]


@pytest.mark.parametrize("wrong, message", [
    (lambda tokens: " ".join("".join(tokens).replace("▁", " ").split()), "a lone ▁ is a space too"),
    (join_pop, "changed its input `tokens` in place"),
    (lambda tokens: {("▁la", "▁mir", "ojn", "▁cas", "is"): "la mirojn casis", (): ""}.get(tuple(tokens), "?"),
     "expected"),
])
def test_join_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_join_pieces(wrong)


class SkipsUnknown(Word):
    def encode(self, text):
        return [i for i in super().encode(text) if i]


def test_word_unknown_words_left_out_are_named():
    with pytest.raises(AssertionError, match="it is not left out"):
        check_word_tokenizer(SkipsUnknown)


class DecodesToList(Word):
    def decode(self, ids):
        return [self.itos[i] for i in ids]


def test_word_decode_must_return_a_str():
    with pytest.raises(AssertionError, match="decode must return the text, a str"):
        check_word_tokenizer(DecodesToList)


# ---------------------------------------------------------------- fresh4: a shared vocabulary, other orders
class SharedVocabulary:
    """The vocabulary is a class attribute: every instance adds to the same dict."""
    stoi: dict = {}

    def __init__(self, texts):
        for word in sorted({word for text in texts for word in text.split()}):
            self.stoi.setdefault(word, len(self.stoi) + 1)
        self.itos = {i: word for word, i in self.stoi.items()} | {0: "<unk>"}

    def encode(self, text):
        return [self.stoi.get(word, 0) for word in text.split()]

    def decode(self, ids):
        return " ".join(self.itos.get(i, "<unk>") for i in ids)


class GlobalVocabulary(Word):
    """Each instance REPLACES a vocabulary kept on the class: the last one built wins for all of them."""

    def __init__(self, texts):
        super().__init__(texts)
        type(self).table, type(self).inverse = self.stoi, self.itos

    def encode(self, text):
        return [type(self).table.get(word, 0) for word in text.split()]

    def decode(self, ids):
        return " ".join(type(self).inverse[i] for i in ids)


class FrequencyOrder(Word):
    def __init__(self, texts):
        words = [word for word, _ in Counter(word for text in texts for word in text.split()).most_common()]
        self.stoi = {word: i for i, word in enumerate(words, start=1)}
        self.itos = {i: word for word, i in self.stoi.items()} | {0: "<unk>"}


class ReverseOrder(Word):
    def __init__(self, texts):
        words = sorted({word for text in texts for word in text.split()}, reverse=True)
        self.stoi = {word: i for i, word in enumerate(words, start=1)}
        self.itos = {i: word for word, i in self.stoi.items()} | {0: "<unk>"}


@pytest.mark.parametrize("wrong, message", [
    (SharedVocabulary, "a word of ANOTHER tokenizer's texts .* shared by every instance"),
    (GlobalVocabulary, "changed what the first one .* gives .* shared by every instance"),
    (FrequencyOrder, r"not in the order of their frequency \(Counter.most_common\)"),
    (ReverseOrder, "not in reverse sorted order"),
    (FirstSeenOrder, "not in the order they first appear"),
])
def test_word_vocabulary_slips_name_what_the_answer_did(wrong, message):
    with pytest.raises(AssertionError, match=message) as caught:
        check_word_tokenizer(wrong)
    assert "whitespace" not in str(caught.value)          # fresh4: a shared vocabulary was blamed on the splitting
