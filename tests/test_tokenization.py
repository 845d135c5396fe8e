"""The shared BPE tokenizer: exact round trip, fixed special-token ids, save/load, and clear errors."""
import pytest
import torch
from tokenizers import Tokenizer, models

from transformer_lib.corpus import load_builtin_corpus
from transformer_lib.tokenization import (BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, SubwordTokenizer,
                                          train_bpe_tokenizer)


@pytest.fixture(scope="module")
def corpus():
    return load_builtin_corpus(n_train=3000, n_valid=300, n_test=300, seed=0)


@pytest.fixture(scope="module")
def texts(corpus):
    return [text for split in corpus.values() for pair in split for text in pair]


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_bpe_tokenizer([text for pair in corpus["train"] for text in pair], vocab_size=200)


def test_special_tokens_have_fixed_ids(tokenizer):
    assert SPECIAL_TOKENS == ("<pad>", "<s>", "</s>", "<unk>")
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == token_id
        assert tokenizer.id_to_token(token_id) == token
    assert tokenizer.vocab_size == 200
    assert tokenizer.token_to_id("no-such-token") is None


def test_round_trip_is_exact_on_the_corpus(tokenizer, texts):
    # Validation and test sentences were not seen in training: subwords still spell them.
    assert tokenizer.decode_batch(tokenizer.encode_batch(texts)) == texts
    for text in texts[:200]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("text, normalised", [
    ("  the   cat\twill  jump ", "the cat will jump"),
    ("la vulpo\nsaltis", "la vulpo saltis"),
    ("la sxipo", "la sxipo"),  # letters in a new order: spelled from smaller pieces
])
def test_decode_gives_the_whitespace_normalised_text(tokenizer, text, normalised):
    assert tokenizer.decode(tokenizer.encode(text)) == normalised


def test_nfc_normalisation_makes_decomposed_letters_known(tokenizer):
    decomposed = "la kurag\u0302a miro"  # g + combining circumflex: NFC turns it into the ĝ of the corpus
    assert tokenizer.encode(decomposed) == tokenizer.encode("la kuraĝa miro")


def test_add_special_tokens_wraps_with_bos_and_eos(tokenizer, texts):
    for text in texts[:50]:
        bare = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.encode(text) == [BOS_ID, *bare, EOS_ID]
        assert BOS_ID not in bare and EOS_ID not in bare and PAD_ID not in bare
    assert tokenizer.decode(tokenizer.encode("la miro saltis"), skip_special_tokens=False).startswith("<s>")


def test_encode_batch_matches_encode(tokenizer, texts):
    for flag in (True, False):
        assert tokenizer.encode_batch(texts[:100], add_special_tokens=flag) == [
            tokenizer.encode(text, add_special_tokens=flag) for text in texts[:100]]


def test_decode_accepts_tensors_and_drops_padding(tokenizer):
    rows = tokenizer.encode_batch(["la miro saltis", "the big dogs will chase a cat"])
    longest = max(map(len, rows))
    padded = torch.tensor([row + [PAD_ID] * (longest - len(row)) for row in rows])  # (B, L)
    assert tokenizer.decode_batch(padded) == ["la miro saltis", "the big dogs will chase a cat"]
    assert tokenizer.decode(padded[0]) == "la miro saltis"
    assert tokenizer.decode_batch([rows[1], rows[0]]) == ["the big dogs will chase a cat", "la miro saltis"]


def test_special_token_text_in_input_is_not_a_control_token(tokenizer):
    ids = tokenizer.encode("the <s> cat", unknown="replace")
    assert ids.count(BOS_ID) == 1 and ids[0] == BOS_ID  # "<s>" typed by a user is text, not a new sentence


def test_save_then_load_gives_identical_ids(tokenizer, texts, tmp_path):
    path = tmp_path / "tokenizer.json"
    tokenizer.save(path)
    reloaded = SubwordTokenizer.load(path)
    assert reloaded.vocab_size == tokenizer.vocab_size
    assert reloaded.encode_batch(texts) == tokenizer.encode_batch(texts)
    assert [reloaded.id_to_token(i) for i in range(reloaded.vocab_size)] == [
        tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    assert reloaded.encode("the <s> cat", unknown="replace") == tokenizer.encode("the <s> cat", unknown="replace")


def test_training_is_deterministic(corpus):
    train = [text for pair in corpus["train"][:1000] for text in pair]
    first, second = train_bpe_tokenizer(train, vocab_size=120), train_bpe_tokenizer(train, vocab_size=120)
    assert [first.id_to_token(i) for i in range(120)] == [second.id_to_token(i) for i in range(120)]


def test_bpe_learns_ordo_endings(corpus):
    bpe = train_bpe_tokenizer([text for pair in corpus["train"] for text in pair], vocab_size=300)
    for token in ["ojn", "ajn", "is", "os", "as"]:
        assert bpe.token_to_id(token) is not None, token
    pieces = [bpe.id_to_token(i) for i in bpe.encode("mirojn", add_special_tokens=False)]
    assert pieces == ["▁mir", "ojn"]


@pytest.mark.parametrize("text", ["", " ", "  \t\n "])
def test_empty_or_whitespace_text_is_rejected(tokenizer, text):
    with pytest.raises(ValueError, match="empty or only whitespace"):
        tokenizer.encode(text)
    with pytest.raises(ValueError, match="empty or only whitespace"):
        tokenizer.encode_batch(["la miro saltis", text])


@pytest.mark.parametrize("text", [5, None, b"the cat", ["the cat"]])
def test_non_str_text_is_a_type_error(tokenizer, text):
    with pytest.raises(TypeError, match="text must be a str"):
        tokenizer.encode(text)


def test_encode_batch_of_a_single_string_is_a_type_error(tokenizer):
    with pytest.raises(TypeError, match="texts must be a list of str"):
        tokenizer.encode_batch("the cat")


def test_unseen_characters_raise_naming_them(tokenizer):
    with pytest.raises(ValueError, match="'猫'.*unknown='replace'"):
        tokenizer.encode("the cat 猫")
    with pytest.raises(ValueError, match="'Q', '猫'"):
        tokenizer.encode_batch(["la miro saltis", "the Queen 猫"])
    ids = tokenizer.encode("the cat 猫", unknown="replace")
    assert ids.count(UNK_ID) == 1 and ids[-2] == UNK_ID
    assert tokenizer.decode(ids).split() == ["the", "cat"]  # <unk> is special, so decode drops it


def test_bad_unknown_mode(tokenizer):
    with pytest.raises(ValueError, match="unknown must be 'error' or 'replace'"):
        tokenizer.encode("the cat", unknown="ignore")


@pytest.mark.parametrize("ids, message", [
    ([1, 5, 10_000], r"ids must be ints in \[0, 200\)"),
    ([1, -1], r"ids must be ints in \[0, 200\)"),
    ([1.0, 5.0], r"ids must be ints"),
    (torch.tensor([[1, 5], [1, 6]]), "1-D integer tensor"),
    (torch.tensor([1.0, 5.0]), "1-D integer tensor"),
])
def test_bad_ids_for_decode(tokenizer, ids, message):
    with pytest.raises(ValueError, match=message):
        tokenizer.decode(ids)


def test_bad_batch_for_decode_batch_and_bad_id_lookup(tokenizer):
    with pytest.raises(ValueError, match=r"\(B, L\) tensor"):
        tokenizer.decode_batch(torch.tensor([1, 5, 2]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.id_to_token(10_000)


@pytest.mark.parametrize("vocab_size, message", [
    (10, "vocab_size=10 is too small"), (0, "vocab_size=0 is too small"), (-5, "vocab_size=-5 is too small"),
    (2.5, "vocab_size must be an int"), ("100", "vocab_size must be an int"), (True, "vocab_size must be an int"),
    (None, "vocab_size must be an int"),
])
def test_bad_vocab_size(corpus, vocab_size, message):
    with pytest.raises(ValueError, match=message):
        train_bpe_tokenizer([e for e, _ in corpus["train"][:200]], vocab_size=vocab_size)


def test_smallest_vocab_size_is_alphabet_plus_specials():
    texts = ["ab ba", "abc"]  # characters a, b, c, plus the word-start marker ▁
    assert train_bpe_tokenizer(texts, vocab_size=8).vocab_size == 8
    with pytest.raises(ValueError, match="4 distinct characters .* need vocab_size >= 8"):
        train_bpe_tokenizer(texts, vocab_size=7)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(texts="the cat"), TypeError, "not one str"),
    (dict(texts=["the cat", 3]), TypeError, "texts must all be str"),
    (dict(texts=[]), ValueError, "no non-empty text"),
    (dict(texts=["", "  "]), ValueError, "no non-empty text"),
    (dict(texts=["the cat"], min_frequency=0), ValueError, "min_frequency must be a positive int"),
])
def test_bad_training_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        train_bpe_tokenizer(**kwargs)


def test_wrapper_checks_the_wrapped_tokenizer(tmp_path):
    with pytest.raises(TypeError, match="tokenizers.Tokenizer"):
        SubwordTokenizer("not a tokenizer")
    with pytest.raises(ValueError, match="'<pad>' at id 0"):
        SubwordTokenizer(Tokenizer(models.BPE()))
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        SubwordTokenizer.load(tmp_path / "missing.json")
