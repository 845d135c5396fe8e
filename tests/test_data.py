"""Tests for transformer_lib.data: reading files, loading corpora, batching by tokens, Batch."""
import ast
import gzip
import os
import random
from pathlib import Path

import pytest
import torch

from transformer_lib import data as data_module
from transformer_lib.data import (MULTI30K_ENV, Batch, TranslationData, load_pairs, multi30k_dir, pad_sequences,
                                  padding_fraction, pairs_from_hf_dataset, read_lines, read_parallel_files,
                                  token_batches)

ROOT = Path(__file__).resolve().parent.parent
GERMAN = ["Zwei Hunde spielen im Schnee.", "Ein Mann liest ein Buch.", "Eine Frau fährt Fahrrad."]
ENGLISH = ["Two dogs play in the snow.", "A man reads a book.", "A woman rides a bicycle."]


def write(path: Path, text: str | bytes, gz: bool | None = None) -> Path:
    """Write `text` (UTF-8 if str) to `path`, gzipped when the name ends in .gz."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if (gz if gz is not None else path.suffix == ".gz") else raw)
    return path


def lines(sentences: list[str]) -> str:
    return "".join(s + "\n" for s in sentences)


@pytest.fixture
def tiny_multi30k(tmp_path: Path) -> Path:
    """A Multi30k-shaped folder: gzipped train, plain val, three pairs each."""
    folder = tmp_path / "multi30k"
    write(folder / "train.de.gz", lines(GERMAN))
    write(folder / "train.en.gz", lines(ENGLISH))
    write(folder / "val.de", lines(GERMAN[:2]))
    write(folder / "val.en", lines(ENGLISH[:2]))
    return folder


# --- reading files -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a.de", "a.de.gz"])
def test_read_lines_plain_and_gzip(tmp_path, name):
    path = write(tmp_path / name, lines(GERMAN))
    assert read_lines(path) == GERMAN
    assert read_lines(str(path)) == GERMAN


def test_read_lines_crlf_bom_and_missing_final_newline(tmp_path):
    path = write(tmp_path / "a.de", "\ufeff" + "\r\n".join(GERMAN))
    assert read_lines(path) == GERMAN


@pytest.mark.parametrize("name", ["a.de", "a.de.gz"])
def test_read_lines_lone_cr_line_endings(tmp_path, name):
    """Old Mac files (no \n at all) end lines with a lone \r. In a file of \n or \r\n lines, a lone \r ends no
    line: it is refused where it is, not read as a line break that would shift every later line by one."""
    assert read_lines(write(tmp_path / name, "\r".join(GERMAN) + "\r")) == GERMAN
    with pytest.raises(ValueError, match=rf"mixed{name}, line 1, column 30: a carriage return"):
        read_lines(write(tmp_path / ("mixed" + name), f"{GERMAN[0]}\r{GERMAN[1]}\r\n{GERMAN[2]}\n"))
    with pytest.raises(ValueError, match=rf"{name}, line 2: empty line"):
        read_lines(write(tmp_path / name, f"{GERMAN[0]}\r\r{GERMAN[1]}\r"))
    pairs = read_parallel_files(write(tmp_path / "cr.de", "\r".join(GERMAN)), write(tmp_path / "lf.en", lines(ENGLISH)))
    assert pairs == list(zip(GERMAN, ENGLISH))


def test_read_parallel_files(tmp_path):
    pairs = read_parallel_files(write(tmp_path / "a.de.gz", lines(GERMAN)), write(tmp_path / "a.en", lines(ENGLISH)))
    assert pairs == list(zip(GERMAN, ENGLISH))


def test_mismatched_line_counts_name_files_and_line(tmp_path):
    src = write(tmp_path / "a.de", lines(GERMAN))
    tgt = write(tmp_path / "a.en", lines(ENGLISH[:2]))
    with pytest.raises(ValueError, match=r"a\.de has 3 lines but .*a\.en has 2: line 3 of .*a\.de has no partner"):
        read_parallel_files(src, tgt)
    with pytest.raises(ValueError, match=r"line 3 of .*a\.de has no partner in .*a\.en"):
        read_parallel_files(tgt, src)


@pytest.mark.parametrize("name", ["a.de", "a.de.gz"])
@pytest.mark.parametrize("blank", ["", "   ", "\r"])
def test_empty_line_names_file_and_line(tmp_path, name, blank):
    path = write(tmp_path / name, lines([GERMAN[0], blank, GERMAN[2]]))
    with pytest.raises(ValueError, match=rf"{name}, line 2: empty line"):
        read_lines(path)


@pytest.mark.parametrize("name", ["a.de", "a.de.gz"])
def test_undecodable_bytes_name_file_and_line(tmp_path, name):
    path = write(tmp_path / name, "\n".join(GERMAN).encode("latin-1"))  # ä is the lone byte 0xE4
    with pytest.raises(ValueError, match=rf"{name}, line 3: bytes that are not UTF-8 .* at byte 12 of the line"):
        read_lines(path)


def test_empty_file(tmp_path):
    with pytest.raises(ValueError, match=r"empty\.de: the file is empty"):
        read_lines(write(tmp_path / "empty.de", b""))


# mtime=0: gzip puts the time in its header, and a test id built from it would differ between the
# workers that collect it (tests/test_collection.py checks that ids never do).
@pytest.mark.parametrize("content", [b"plain text, not gzip\n", gzip.compress(b"cut short\n", mtime=0)[:-6]],
                         ids=["not_gzip", "truncated_gzip"])
def test_bad_gzip(tmp_path, content):
    path = tmp_path / "a.de.gz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"a\.de\.gz: not a valid gzip file"):
        read_lines(path)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.de: no such file"):
        read_lines(tmp_path / "missing.de")
    with pytest.raises(FileNotFoundError, match="a folder, not a file"):
        read_lines(tmp_path)


# --- Hugging Face datasets -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_datasets():
    return pytest.importorskip("datasets")


def test_pairs_from_hf_dataset_column_per_language(hf_datasets):
    dataset = hf_datasets.Dataset.from_dict({"de": GERMAN, "en": ENGLISH})
    assert pairs_from_hf_dataset(dataset, "de", "en") == list(zip(GERMAN, ENGLISH))
    assert pairs_from_hf_dataset(dataset, "en", "de") == list(zip(ENGLISH, GERMAN))
    with pytest.raises(ValueError, match=r"none named \['fr'\]"):
        pairs_from_hf_dataset(dataset, "de", "fr")


def test_pairs_from_hf_dataset_translation_column(hf_datasets):
    rows = [{"en": e, "it": f"it {i}"} for i, e in enumerate(ENGLISH)]
    dataset = hf_datasets.Dataset.from_dict({"id": ["0", "1", "2"], "translation": rows})
    assert pairs_from_hf_dataset(dataset, "en", "it") == [(e, f"it {i}") for i, e in enumerate(ENGLISH)]
    assert pairs_from_hf_dataset(dataset, "it", "en")[1] == ("it 1", ENGLISH[1])
    with pytest.raises(ValueError, match=r"row 0 of the 'translation' column has languages \['en', 'it'\]"):
        pairs_from_hf_dataset(dataset, "en", "de")


@pytest.mark.parametrize("de, en, error, message", [
    (["a", "b", None], ["x", "y", "z"], ValueError, r"row 2, field row\['de'\]: no text \(None\)"),
    (["a", "", "c"], ["x", "y", "z"], ValueError, r"row 1, field row\['de'\]: an empty text"),
    (["a", "b", "c"], ["x", "y", "  "], ValueError, r"row 2, field row\['en'\]: an empty text"),
    ([1, 2, 3], ["x", "y", "z"], TypeError, r"row 0, field row\['de'\]: a value of type int \(1\), not a text"),
])
def test_pairs_from_hf_dataset_refuses_rows_without_text(hf_datasets, de, en, error, message):
    dataset = hf_datasets.Dataset.from_dict({"de": de, "en": en})
    with pytest.raises(error, match=message) as caught:
        pairs_from_hf_dataset(dataset, "de", "en")
    if error is ValueError:   # the fix it suggests works
        assert "dataset.filter(" in str(caught.value)
        keep = eval(str(caught.value).split("dataset = dataset.filter(", 1)[1][:-1])
        assert pairs_from_hf_dataset(dataset.filter(keep), "de", "en") == [
            (d, e) for d, e in zip(de, en) if (d or "").strip() and (e or "").strip()]


@pytest.mark.parametrize("it, error, message", [
    (None, ValueError, r"row 1, field row\['translation'\]\['it'\]: no text \(None\)"),
    ("", ValueError, r"row 1, field row\['translation'\]\['it'\]: an empty text"),
])
def test_pairs_from_hf_dataset_translation_rows_without_text(hf_datasets, it, error, message):
    rows = [{"en": "Hello.", "it": "Ciao."}, {"en": "Bye.", "it": it}]
    with pytest.raises(error, match=message):
        pairs_from_hf_dataset(hf_datasets.Dataset.from_dict({"translation": rows}), "en", "it")
    numbers = hf_datasets.Dataset.from_dict({"translation": [{"en": "Hello.", "it": 5}]})
    with pytest.raises(TypeError, match=r"row 0, field row\['translation'\]\['it'\]: a value of type int"):
        pairs_from_hf_dataset(numbers, "en", "it")


def test_pairs_from_hf_dataset_rejects_a_dataset_dict(hf_datasets):
    dataset_dict = hf_datasets.DatasetDict({"train": hf_datasets.Dataset.from_dict({"de": GERMAN, "en": ENGLISH})})
    with pytest.raises(TypeError, match="pick a split first"):
        pairs_from_hf_dataset(dataset_dict, "de", "en")


def test_hub_path_offline(hf_datasets, monkeypatch):
    """The Hub path, with load_dataset replaced: our split and configuration names become the Hub's."""
    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        if path == "Helsinki-NLP/opus_books":
            return hf_datasets.Dataset.from_dict({"translation": [{"en": "Hello.", "it": "Ciao."}]})
        return hf_datasets.Dataset.from_dict({"de": GERMAN, "en": ENGLISH})

    monkeypatch.setattr(hf_datasets, "load_dataset", fake_load_dataset)
    monkeypatch.delenv(MULTI30K_ENV, raising=False)
    assert load_pairs("multi30k", "valid") == list(zip(GERMAN, ENGLISH))
    assert load_pairs("multi30k", "test_2016", "en", "de", limit=1) == [(ENGLISH[0], GERMAN[0])]
    assert load_pairs("opus_books", "train") == [("Hello.", "Ciao.")]
    assert load_pairs("opus_books", "train", "it", "en") == [("Ciao.", "Hello.")]
    assert calls == [("bentrevett/multi30k", None, "validation"), ("bentrevett/multi30k", None, "test"),
                     ("Helsinki-NLP/opus_books", "en-it", "train"), ("Helsinki-NLP/opus_books", "en-it", "train")]


@pytest.mark.parametrize("name, split, message", [
    ("multi30k", "test_2017", r"bentrevett/multi30k on the Hub has splits .* not 'test_2017'; set \$MULTI30K_DIR"),
    ("opus_books", "valid", r"Helsinki-NLP/opus_books on the Hub has splits \['train'\], not 'valid'"),
])
def test_hub_split_missing_is_an_error_before_download(monkeypatch, name, split, message):
    monkeypatch.delenv(MULTI30K_ENV, raising=False)
    with pytest.raises(ValueError, match=message):
        load_pairs(name, split)


# --- load_pairs ----------------------------------------------------------------------------------------

def test_load_pairs_builtin():
    valid = load_pairs("builtin", "valid")
    assert len(valid) == 500 and all(isinstance(s, str) and isinstance(t, str) for s, t in valid)
    assert load_pairs("builtin", "valid", limit=3) == valid[:3]


def test_load_pairs_multi30k_from_folder(tiny_multi30k, monkeypatch):
    monkeypatch.delenv(MULTI30K_ENV, raising=False)
    assert load_pairs("multi30k", "train", data_dir=tiny_multi30k) == list(zip(GERMAN, ENGLISH))
    assert load_pairs("multi30k", "valid", data_dir=str(tiny_multi30k)) == list(zip(GERMAN[:2], ENGLISH[:2]))
    assert load_pairs("multi30k", "train", "en", "de", data_dir=tiny_multi30k, limit=2) == list(zip(ENGLISH, GERMAN))[:2]


def test_load_pairs_multi30k_from_env(tiny_multi30k, tmp_path, monkeypatch):
    monkeypatch.setenv(MULTI30K_ENV, str(tiny_multi30k))
    assert multi30k_dir() == tiny_multi30k
    assert load_pairs("multi30k", "train") == list(zip(GERMAN, ENGLISH))
    assert multi30k_dir(tmp_path) == tmp_path                       # data_dir wins over the variable
    monkeypatch.delenv(MULTI30K_ENV)
    assert multi30k_dir() is None


def test_load_pairs_multi30k_missing_folder_and_file(tiny_multi30k, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Multi30k folder .*nowhere does not exist; set \$MULTI30K_DIR"):
        load_pairs("multi30k", "train", data_dir=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"test_2016_flickr\.de\.gz: no such file \(nor test_2016_flickr\.de\)"):
        load_pairs("multi30k", "test_2016", data_dir=tiny_multi30k)


def test_load_pairs_multi30k_malformed_file(tiny_multi30k):
    write(tiny_multi30k / "train.en.gz", lines([ENGLISH[0], "", ENGLISH[2]]))
    with pytest.raises(ValueError, match=r"train\.en\.gz, line 2: empty line"):
        load_pairs("multi30k", "train", data_dir=tiny_multi30k)


@pytest.mark.parametrize("name, split, message", [
    ("wmt14", "train", "unknown corpus 'wmt14'"),
    ("builtin", "test_2016", r"builtin corpus has splits \['train', 'valid', 'test'\], not 'test_2016'"),
    ("multi30k", "test", r"multi30k has splits .*, not 'test'"),
])
def test_load_pairs_unknown_corpus_or_split(name, split, message):
    with pytest.raises(ValueError, match=message):
        load_pairs(name, split)


@pytest.mark.parametrize("limit", [-1, 1.5, True])
def test_load_pairs_bad_limit(limit):
    with pytest.raises(ValueError, match="limit must be None or an int >= 0"):
        load_pairs("builtin", "valid", limit=limit)


def _real_multi30k_dir() -> Path:
    return Path(os.environ.get(MULTI30K_ENV) or ROOT.parent / "shared" / "data" / "multi30k")


@pytest.mark.skipif(not _real_multi30k_dir().is_dir(), reason="Multi30k files not present (set MULTI30K_DIR)")
@pytest.mark.parametrize("split, size", [("train", 29000), ("valid", 1014), ("test_2016", 1000), ("test_2017", 1000)])
def test_real_multi30k(split, size):
    pairs = load_pairs("multi30k", split, data_dir=_real_multi30k_dir())
    assert len(pairs) == size
    assert all(src.strip() and tgt.strip() for src, tgt in pairs)


# --- batching ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lengths() -> list[tuple[int, int]]:
    """Uneven (source, target) lengths, like a real corpus: mostly short, some long."""
    rng = random.Random(0)
    out = []
    for _ in range(3000):
        s = min(60, max(3, int(rng.lognormvariate(2.6, 0.5))))
        out.append((s, min(60, max(3, s + rng.randint(-4, 4)))))
    return out


@pytest.mark.parametrize("bucket", [True, False])
@pytest.mark.parametrize("max_tokens", [60, 500, 4096])
def test_token_batches_budget_and_coverage(lengths, bucket, max_tokens):
    batches = token_batches(lengths, max_tokens, seed=3, bucket=bucket)
    for batch in batches:
        assert batch, "no empty batches"
        for side in (0, 1):
            assert len(batch) * max(lengths[i][side] for i in batch) <= max_tokens
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))


def test_token_batches_deterministic_per_seed(lengths):
    assert token_batches(lengths, 1000, seed=7) == token_batches(lengths, 1000, seed=7)
    assert token_batches(lengths, 1000, seed=7) != token_batches(lengths, 1000, seed=8)
    assert token_batches(lengths, 1000, shuffle=False) == token_batches(lengths, 1000, shuffle=False, seed=9)


def test_bucketing_reduces_padding(lengths):
    for max_tokens in (500, 4096):
        naive = padding_fraction(lengths, token_batches(lengths, max_tokens, bucket=False))
        bucketed = padding_fraction(lengths, token_batches(lengths, max_tokens, bucket=True))
        assert bucketed < naive / 3, (max_tokens, naive, bucketed)


def test_padding_fraction_known_value():
    lengths = [(2, 4), (4, 4)]
    # source: 2 + 4 real of 2 * 4 padded; target: 8 real of 8 -> 1 - 14 / 16
    assert padding_fraction(lengths, [[0, 1]]) == pytest.approx(1 - 14 / 16)
    assert padding_fraction(lengths, [[0], [1]]) == 0.0
    assert padding_fraction(lengths, []) == 0.0


def test_too_long_example_is_an_error(lengths):
    with pytest.raises(ValueError, match=r"example 1 has 3 source and 9 target tokens, more than max_tokens=8"):
        token_batches([(3, 3), (3, 9)], max_tokens=8)


@pytest.mark.parametrize("max_tokens", [0, -5, 2.5, True])
def test_bad_max_tokens(max_tokens):
    with pytest.raises(ValueError, match="max_tokens must be a positive int"):
        token_batches([(3, 3)], max_tokens)


# --- Batch ---------------------------------------------------------------------------------------------

PAD = 0


def test_pad_sequences():
    out = pad_sequences([[5, 6, 7], [8]], PAD)
    torch.testing.assert_close(out, torch.tensor([[5, 6, 7], [8, 0, 0]]))
    assert out.dtype == torch.long
    with pytest.raises(ValueError, match="at least one sequence"):
        pad_sequences([], PAD)


def test_batch_shift_and_masks():
    examples = [([1, 10, 11, 2], [1, 20, 21, 22, 2]), ([1, 12, 2], [1, 23, 2])]
    batch = Batch.from_examples(examples, PAD)
    torch.testing.assert_close(batch.src, torch.tensor([[1, 10, 11, 2], [1, 12, 2, 0]]))
    torch.testing.assert_close(batch.tgt_in, torch.tensor([[1, 20, 21, 22], [1, 23, 2, 0]]))
    torch.testing.assert_close(batch.tgt_out, torch.tensor([[20, 21, 22, 2], [23, 2, 0, 0]]))
    torch.testing.assert_close(batch.src_key_padding_mask, torch.tensor([[False] * 4, [False] * 3 + [True]]))
    torch.testing.assert_close(batch.tgt_key_padding_mask, torch.tensor([[False] * 4, [False] * 3 + [True]]))
    assert batch.n_target_tokens == 4 + 2
    assert batch.pad_id == PAD
    moved = batch.to("cpu")
    assert moved.pad_id == PAD and torch.equal(moved.tgt_out, batch.tgt_out)


@pytest.mark.parametrize("examples, message", [
    ([], "at least one example"),
    ([([1, 2], [1])], "example 0 has 2 source and 1 target ids"),
    ([([1, 2], [1, 2]), ([], [1, 2])], "example 1 has 0 source and 2 target ids"),
])
def test_batch_bad_examples(examples, message):
    with pytest.raises(ValueError, match=message):
        Batch.from_examples(examples, PAD)


@pytest.mark.parametrize("multiple", [1, 2, 8])
def test_batch_pad_to_multiple_pads_with_pad_and_keeps_the_masks(multiple):
    examples = [([1, 10, 11, 2], [1, 20, 21, 22, 2]), ([1, 12, 2], [1, 23, 2])]
    plain, padded = Batch.from_examples(examples, PAD), Batch.from_examples(examples, PAD, pad_to_multiple=multiple)
    S, T = plain.src.size(1), plain.tgt_in.size(1)                 # 4 and 4
    assert padded.src.size(1) == -(-S // multiple) * multiple and padded.tgt_in.size(1) == -(-T // multiple) * multiple
    torch.testing.assert_close(padded.src[:, :S], plain.src)
    torch.testing.assert_close(padded.tgt_out[:, :T], plain.tgt_out)
    torch.testing.assert_close(padded.tgt_in[:, :T], plain.tgt_in)
    assert (padded.src[:, S:] == PAD).all() and (padded.tgt_out[:, T:] == PAD).all()
    # Beyond T, tgt_in reads at most the longest target's </s> (as shorter rows always did), then <pad>.
    assert set(padded.tgt_in[:, T:].unique().tolist()) <= {PAD, 2}
    torch.testing.assert_close(padded.src_key_padding_mask, padded.src == PAD)
    torch.testing.assert_close(padded.tgt_key_padding_mask, padded.tgt_in == PAD)
    assert padded.n_target_tokens == plain.n_target_tokens == 6


def test_pad_sequences_to_a_length():
    torch.testing.assert_close(pad_sequences([[5, 6], [7]], PAD, length=4), torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]]))
    with pytest.raises(ValueError, match=r"length must be None or an int >= the longest sequence \(2\), got 1"):
        pad_sequences([[5, 6], [7]], PAD, length=1)


@pytest.mark.parametrize("bad", [0, -8, 2.0, True, "8", None])
def test_pad_to_multiple_must_be_a_positive_int(bad, tokenizer_and_pairs):
    with pytest.raises(ValueError, match="pad_to_multiple must be a positive int"):
        Batch.from_examples([([1, 2], [1, 2])], PAD, pad_to_multiple=bad)
    tokenizer, pairs = tokenizer_and_pairs
    with pytest.raises(ValueError, match="pad_to_multiple must be a positive int"):
        TranslationData(pairs[:5], tokenizer, pad_to_multiple=bad)


# --- TranslationData -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer_and_pairs():
    from transformer_lib.tokenization import train_bpe_tokenizer
    pairs = load_pairs("builtin", "valid")
    return train_bpe_tokenizer([t for p in pairs for t in p], vocab_size=300), pairs


def test_translation_data_batches(tokenizer_and_pairs):
    tokenizer, pairs = tokenizer_and_pairs
    data = TranslationData(pairs, tokenizer, max_tokens=300)
    assert len(data) == len(pairs)
    epoch0 = data.batches(0)
    assert sum(b.src.size(0) for b in epoch0) == len(pairs)
    assert max(b.src.numel() for b in epoch0) <= 300
    assert max(b.tgt_out.size(0) * (b.tgt_out.size(1) + 1) for b in epoch0) <= 300
    again = data.batches(0)
    assert all(torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out) for a, b in zip(epoch0, again))
    assert [b.src.shape for b in data.batches(1)] != [b.src.shape for b in epoch0]
    assert sum(b.n_target_tokens for b in epoch0) == sum(len(tokenizer.encode(t)) - 1 for _, t in pairs)
    first = epoch0[0]
    assert (first.tgt_in[:, 0] == tokenizer.bos_id).all()


def test_translation_data_pad_to_multiple(tokenizer_and_pairs):
    """Every batch is padded to multiples of 8, max_tokens counts the padded lengths, the examples and their
    real target tokens are those of the unpadded batching, and the default keeps today's batches."""
    tokenizer, pairs = tokenizer_and_pairs
    plain, padded = (TranslationData(pairs, tokenizer, max_tokens=300, pad_to_multiple=m) for m in (1, 8))
    assert plain.padded_lengths == plain.lengths == padded.lengths
    epoch = padded.batches(0)
    assert all(b.src.size(1) % 8 == 0 and b.tgt_in.size(1) % 8 == 0 for b in epoch)
    assert max(b.src.numel() for b in epoch) <= 300
    assert max(b.tgt_out.size(0) * (b.tgt_out.size(1) + 1) for b in epoch) <= 300
    assert sum(b.src.size(0) for b in epoch) == len(pairs)
    assert sum(b.n_target_tokens for b in epoch) == sum(b.n_target_tokens for b in plain.batches(0))
    shapes = {m: {(b.src.shape, b.tgt_in.shape) for b in data.batches(0)} for m, data in ((1, plain), (8, padded))}
    assert len(shapes[8]) < len(shapes[1])
    default = TranslationData(pairs, tokenizer, max_tokens=300)
    assert all(torch.equal(a.src, b.src) and torch.equal(a.tgt_in, b.tgt_in)
               for a, b in zip(default.batches(3), plain.batches(3)))


def test_translation_data_max_len_counts_the_padded_length(tokenizer_and_pairs):
    """A pair that fits max_len but whose padded batch would not is dropped, so the model's positional table
    always holds a batch (max_len=10, multiple 8: S <= 8 and T + 1 <= 10 are kept)."""
    tokenizer, pairs = tokenizer_and_pairs
    data = TranslationData(pairs, tokenizer, max_len=10, pad_to_multiple=8)
    assert 0 < len(data) < len(TranslationData(pairs, tokenizer, max_len=10))
    assert all(b.src.size(1) <= 10 and b.tgt_in.size(1) <= 10 for b in data.batches(0))
    with pytest.raises(ValueError, match=r"once padded to a multiple of 8, more than max_tokens=12"):
        TranslationData(pairs, tokenizer, max_tokens=12, pad_to_multiple=8)


@pytest.mark.parametrize("bad, error, message", [
    (("a cat", ""), ValueError, r"pair 1 \('a cat', ''\) has an empty target"),
    (("a cat", "   "), ValueError, r"pair 1 \('a cat', '   '\) has an empty target"),
    (("", "regino"), ValueError, r"pair 1 \('', 'regino'\) has an empty source"),
    (("a cat", None), TypeError, r"pair 1 \('a cat', None\) has a target of type NoneType"),
    ((3, "regino"), TypeError, r"pair 1 \(3, 'regino'\) has a source of type int"),
    (("a cat",), TypeError, r"pair 1 is \('a cat',\), not a \(source, target\) pair"),
])
def test_translation_data_names_a_pair_without_text(tokenizer_and_pairs, bad, error, message):
    tokenizer, pairs = tokenizer_and_pairs
    with pytest.raises(error, match=message):
        TranslationData([pairs[0], bad, pairs[2]], tokenizer)


def test_translation_data_max_len_and_too_long(tokenizer_and_pairs):
    tokenizer, pairs = tokenizer_and_pairs
    short = TranslationData(pairs, tokenizer, max_len=8)
    assert 0 < len(short) < len(pairs)
    assert max(max(length) for length in short.lengths) <= 8
    with pytest.raises(ValueError, match=r"more than max_tokens=6; raise max_tokens or drop long examples"):
        TranslationData(pairs, tokenizer, max_tokens=6)


def test_data_module_stays_on_the_text_side():
    """data.py must not import model-side modules (embeddings, attention, ..., model)."""
    model_side = {"embeddings", "positional", "attention", "multihead", "sublayers", "encoder", "decoder", "model",
                  "decoding", "evaluation", "training"}
    tree = ast.parse(Path(data_module.__file__).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[-1])
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[-1] for alias in node.names)
    assert not imported & model_side, imported & model_side
