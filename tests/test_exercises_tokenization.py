"""The checkers of notebook 01's exercises: plausible slips -> a clear error, right -> True.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import pytest

from transformer_lib.exercises.tokenization import check_join_pieces, check_word_tokenizer


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


@pytest.mark.parametrize("wrong, message", [
    (NoUnk, "map it to <unk>"),
    (FromZero, "id 0 is <unk>"),
    (NoSpaces, "single spaces"),
])
def test_word_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_word_tokenizer(wrong)


def test_word_right_answer(capsys):
    assert check_word_tokenizer(Word) is True
    assert "correct" in capsys.readouterr().out


def join_stub(tokens):
    raise NotImplementedError


def join(tokens):
    return "".join(tokens).replace("▁", " ")[1:]


@pytest.mark.parametrize("wrong, message", [
    (lambda tokens: "".join(tokens).replace("▁", " "), "leading space"),
    (lambda tokens: "".join(tokens)[1:], "must become a space"),
    (lambda tokens: " ".join(t.lstrip("▁") for t in tokens if t.lstrip("▁")), "without spaces"),
])
def test_join_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_join_pieces(wrong)


def test_join_stub_and_right_answer(capsys):
    assert check_join_pieces(join_stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    assert check_join_pieces(join) is True


def test_join_agrees_with_the_course_tokenizer():
    from transformer_lib.tokenization import train_bpe_tokenizer
    texts = ["la miro la vaskon casis", "the kitten jumped", "a brave bird will rest"] * 3
    tokenizer = train_bpe_tokenizer(texts, vocab_size=60, min_frequency=1)
    for text in texts[:3]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert join([tokenizer.id_to_token(i) for i in ids]) == tokenizer.decode(ids) == text
