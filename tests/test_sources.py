"""Tests for reading parallel text as people have it (transformer_lib.readers) and for the data source of a run
(transformer_lib.sources): files, tables and Hub datasets, what is refused and where, carving and fingerprints."""
import bz2
import gzip
import json
import lzma
import os
import threading
import tracemalloc

import pytest

from transformer_lib.readers import load_hub_pairs, read_lines, read_parallel_files, read_table
from transformer_lib.sources import DataSource, fingerprint_pairs, parse_data_spec, read_source

GERMAN = ["Zwei Hunde spielen im Schnee.", "Ein Mann liest ein Buch.", "Eine Frau fährt Fahrrad."]
ENGLISH = ["Two dogs play in the snow.", "A man reads a book.", "A woman rides a bicycle."]


def text(sentences: list[str], end: str = "\n") -> bytes:
    return "".join(s + end for s in sentences).encode("utf-8")


def write(path, data: bytes):
    path.write_bytes(data)
    return path


# --- text files: unusual but valid -----------------------------------------------------------------------

@pytest.mark.parametrize("name, pack", [
    ("a.de.gz", gzip.compress), ("a.de.GZ", gzip.compress), ("a.de", gzip.compress),
    ("a.txt", bz2.compress), ("a.de.xz", lzma.compress), ("a.de.bz2", bz2.compress),
], ids=["gz", "GZ_suffix", "gzip_without_suffix", "bzip2_named_txt", "xz", "bz2"])
def test_compressed_files_are_read_whatever_their_name(tmp_path, name, pack):
    assert read_lines(write(tmp_path / name, pack(text(GERMAN)))) == GERMAN


@pytest.mark.parametrize("data", [
    "\ufeff" + "\r\n".join(GERMAN) + "\r\n", "\r".join(GERMAN) + "\r", "\n".join(GERMAN),
], ids=["bom_and_crlf", "old_mac_cr", "no_final_newline"])
def test_line_endings_and_a_leading_bom(tmp_path, data):
    assert read_lines(write(tmp_path / "a.de", data.encode("utf-8"))) == GERMAN


def test_scripts_without_spaces(tmp_path):
    sentences = ["我喜欢学习语言。", "ฉันชอบเรียนภาษา",
                 "日本語を勉強しています。"]
    assert read_lines(write(tmp_path / "a.zh", text(sentences))) == sentences


def test_a_named_pipe_is_read_as_a_stream(tmp_path):
    pipe = tmp_path / "pipe.de"
    os.mkfifo(pipe)
    # a daemon: should reading fail before it opens the pipe, the blocked writer must not keep pytest alive
    writer = threading.Thread(target=lambda: pipe.write_bytes(gzip.compress(text(GERMAN), mtime=0)), daemon=True)
    writer.start()
    try:
        assert read_lines(pipe) == GERMAN
    finally:
        writer.join(timeout=10)


# --- text files: refused, with the file, line and column ---------------------------------------------------

def utf16(data: str, codec: str) -> bytes:
    return data.encode(codec)


@pytest.mark.parametrize("data, message", [
    ("\n".join(GERMAN).encode("utf-16"), r"UTF-16 text \(it starts with a UTF-16 byte-order mark\)"),
    ("\n".join(GERMAN).encode("utf-16-le"), r"UTF-16 text without a byte-order mark"),
    ("\n".join(GERMAN).encode("utf-16-be"), r"UTF-16 text without a byte-order mark"),
    ("\n".join(GERMAN).encode("utf-32"), r"UTF-32 text \(it starts with a UTF-32 byte-order mark\)"),
    ("\n".join(GERMAN).encode("utf-32-le"), r"UTF-32 text without a byte-order mark"),
], ids=["utf16_bom", "utf16le", "utf16be", "utf32_bom", "utf32le"])
def test_utf16_and_utf32_are_named_with_the_conversion(tmp_path, data, message):
    with pytest.raises(ValueError, match=message) as caught:
        read_lines(write(tmp_path / "a.de", data))
    assert "iconv -f UTF-" in str(caught.value) and "latin1" not in str(caught.value)


@pytest.mark.parametrize("data, message", [
    (b"PK\x03\x04" + bytes(40), r"zip-compressed data, .*unzip it first"),
    (b"(\xb5/\xfd" + bytes(40), r"zstd-compressed data, .*zstd -d"),
    (text(GERMAN), r"a\.de\.gz: not a valid gzip file \(its name ends in \.gz"),
    (gzip.compress(text(GERMAN * 50), mtime=0)[:-30], r"a\.de\.gz: not a valid gzip file: its data is cut short"),
], ids=["zip", "zstd", "named_gz_but_plain", "truncated_gzip"])
def test_compression_that_cannot_be_read(tmp_path, data, message):
    with pytest.raises(ValueError, match=message):
        read_lines(write(tmp_path / "a.de.gz", data))


@pytest.mark.parametrize("line, message", [
    ("Ein\x00Mann", r"line 2, column 4: a NUL byte \(U\+0000\)"),
    ("Ein \x1b[1mMann", r"line 2, column 5: a control character \(U\+001B\)"),
    ("Ein Mann\x85", r"line 2, column 9: a control character \(U\+0085\)"),
    ("\u200b\u200c \u200b", r"line 2: only invisible characters \(U\+200B, U\+200C\)"),
    ("\u3000\t", r"line 2: empty line"),
    ("\ufeffEin Mann liest.", r"line 2: starts with a byte-order mark \(U\+FEFF\), as `cat a b` leaves"),
    ("Ein Mann\u2028liest.", r"line 2, column 9: a line separator \(U\+2028\)"),
], ids=["nul", "escape", "c1_next_line", "zero_width_only", "ideographic_space", "bom_mid_file", "line_separator"])
def test_what_no_sentence_holds_is_named_with_line_and_column(tmp_path, line, message):
    with pytest.raises(ValueError, match=r"a\.de, " + message):
        read_lines(write(tmp_path / "a.de", text([GERMAN[0], line, GERMAN[2]])))


def test_a_stray_carriage_return_is_blamed_on_its_line(tmp_path):
    sentences = [f"Satz Nummer {i}." for i in range(1, 201)]
    sentences[63] = "Satz\rNummer 64."
    src = write(tmp_path / "a.de", text(sentences))
    tgt = write(tmp_path / "a.en", text([f"Sentence number {i}." for i in range(1, 201)]))
    message = r"a\.de, line 64, column 5: a carriage return \(\\r\) that ends no line"
    with pytest.raises(ValueError, match=message):
        read_lines(src)
    with pytest.raises(ValueError, match=message):
        read_parallel_files(src, tgt)


def test_mixed_old_mac_and_unix_line_endings_are_named(tmp_path):
    """A file whose first 64 KiB end lines in a lone \\r is read as an old Mac file; a \\n later on is refused."""
    old_mac = "\r".join(f"Satz {i}." for i in range(1, 8001)) + "\r"
    with pytest.raises(ValueError, match=r"a\.de, line 8001, column 8: a line feed \(\\n\), .* line endings are mixed"):
        read_lines(write(tmp_path / "a.de", (old_mac + "Satz X.\nSatz Y.\n").encode()))
    assert len(read_lines(write(tmp_path / "b.de", old_mac.encode()))) == 8000


def test_every_file_is_closed_also_after_an_error(tmp_path):
    """Decompressors leave the file under them open: reading must close it, on success and on error."""
    import gc
    import warnings
    good = write(tmp_path / "a.de.gz", gzip.compress(text(GERMAN)))
    bad = write(tmp_path / "b.de.bz2", bz2.compress(text([GERMAN[0], "", GERMAN[2]])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_lines(good)
        for action in (lambda: read_lines(bad), lambda: read_parallel_files(bad, good),
                       lambda: read_table(good, src_column=3)):
            with pytest.raises(ValueError):
                action()
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_unequal_line_counts_give_both_counts(tmp_path):
    src = write(tmp_path / "a.de", text(GERMAN))
    tgt = write(tmp_path / "a.en", text(ENGLISH[:2]))
    with pytest.raises(ValueError, match=r"a\.de has 3 lines but .*a\.en has 2: line 3 of .*a\.de has no partner"):
        read_parallel_files(src, tgt)
    with pytest.raises(ValueError, match=r"a\.en has 2 lines but .*a\.de has 3: line 3 of .*a\.de has no partner"):
        read_parallel_files(tgt, src)


def test_the_same_file_or_text_on_both_sides(tmp_path):
    src = write(tmp_path / "a.de", text(GERMAN))
    (tmp_path / "link.de").symlink_to(src)
    for other in (src, tmp_path / "link.de"):
        with pytest.raises(ValueError, match=r"a\.de is given as both the source and the target file"):
            read_parallel_files(src, other)
    with pytest.raises(ValueError, match=r"hold the same 3 lines: the same text on both sides"):
        read_parallel_files(src, write(tmp_path / "copy.de", text(GERMAN)))


def test_symbolic_link_loop_and_dangling_link(tmp_path):
    (tmp_path / "loop.de").symlink_to(tmp_path / "loop.de")
    with pytest.raises(ValueError, match=r"loop\.de: a symbolic link loop"):
        read_lines(tmp_path / "loop.de")
    (tmp_path / "dangling.de").symlink_to(tmp_path / "gone.de")
    with pytest.raises(FileNotFoundError, match=r"dangling\.de: a symbolic link to .*gone\.de, which does not exist"):
        read_lines(tmp_path / "dangling.de")


def test_reading_streams_without_holding_the_text_twice(tmp_path):
    """The peak of memory while reading stays near what the pairs themselves hold: 1.09 times here. The reader
    this one replaced, which read the whole file and split it, peaked at 1.27 times on these files."""
    n = 20_000
    src = write(tmp_path / "big.de.gz", gzip.compress(text([f"Satz Nummer {i} über den Hund." for i in range(n)])))
    tgt = write(tmp_path / "big.en", text([f"Sentence number {i} about the dog." for i in range(n)]))
    tracemalloc.start()
    try:
        pairs = read_parallel_files(src, tgt)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(pairs) == n
    assert peak < 1.2 * held, f"peak {peak} bytes while the pairs hold {held}"


# --- tables ---------------------------------------------------------------------------------------------------

def test_tsv_quotes_are_text_and_extra_columns_are_skipped(tmp_path):
    rows = ['1\t"Run!"\t77\t"Lauf!"', '2\tWho?\t78\tWer?', "3\tIt's 5\" long.\t79\tEs ist 5\" lang."]
    path = write(tmp_path / "tatoeba.tsv", text(rows))
    assert read_table(path, src_column=1, tgt_column=3) == [
        ('"Run!"', '"Lauf!"'), ("Who?", "Wer?"), ("It's 5\" long.", "Es ist 5\" lang.")]


def test_csv_quoted_fields_with_commas_and_newlines(tmp_path):
    """A line break inside a quoted field is the file's own line ending, so a CRLF file's reads as \\n."""
    data = ('id,en,de\r\n1,"Hello, world.","Hallo, Welt."\r\n2,"Two\nlines","Zwei\r\nZeilen"\r\n'
            '3,"A ""quote"".",Ein Zitat.\r\n')
    path = write(tmp_path / "pairs.csv", ("\ufeff" + data).encode("utf-8"))
    assert read_table(path, ",", quoted=True, header=True, src_column="en", tgt_column="de") == [
        ("Hello, world.", "Hallo, Welt."), ("Two\nlines", "Zwei\nZeilen"), ('A "quote".', "Ein Zitat.")]


@pytest.mark.parametrize("data, options, message", [
    ("en\tde\nHi\tHallo\n", {"header": True, "src_column": "en", "tgt_column": "fr"},
     r"no column named 'fr'; its header \(line 1\) names \['en', 'de'\]"),
    ("Hi\tHallo\n", {"src_column": "en"}, r"column 'en' is a name, but the table has no header row"),
    ("Hi,Hallo\n", {"tgt_column": 1}, r"no column 1; line 1 has 1 field\(s\), .*is the delimiter right"),
    ("Hi\tHallo\nYes\tJa\tdoch\n", {}, r"line 2: 3 fields where line 1 has 2; a delimiter inside a sentence\? "
                                        r"quote such fields and read the file as CSV"),
    ("Hi\tHallo\nYes\n", {}, r"line 2: 1 fields where line 1 has 2; a sentence or its delimiter missing"),
    ("Hi\tHallo\nYes\t \n", {}, r"line 2, column 1: an empty text; every row needs a sentence in both columns"),
    ("Hi\tHallo\nYes\tJ\x00a\n", {}, r"line 2, column 1, character 2: a NUL byte"),
    ("a\tb\n" * 63 + "Hi\tHa\rllo\n" + "a\tb\n" * 10, {}, r"line 64: not a well-formed row"),
], ids=["missing_name", "name_without_header", "index_out_of_range", "extra_field", "missing_field", "empty_field", "nul",
        "stray_cr"])
def test_tsv_errors_name_line_and_column(tmp_path, data, options, message):
    with pytest.raises(ValueError, match=r"pairs\.tsv.*" + message):
        read_table(write(tmp_path / "pairs.tsv", data.encode("utf-8")), **options)


def test_csv_unclosed_quote_and_line_numbers_after_a_multiline_field(tmp_path):
    data = 'en,de\n"One\ntwo\nthree",Eins\nHi,\n'
    with pytest.raises(ValueError, match=r"pairs\.csv, line 5, column 'de': an empty text"):
        read_table(write(tmp_path / "pairs.csv", data.encode()), ",", quoted=True, header=True,
                   src_column="en", tgt_column="de")
    with pytest.raises(ValueError, match=r"pairs\.csv, line 2: not a well-formed row .*check the quotes"):
        read_table(write(tmp_path / "pairs.csv", b'Hi,Hallo\n"Oh,Ach\nYes,Ja\n'), ",", quoted=True)


# --- Hugging Face datasets, through the real loading code -------------------------------------------------------

@pytest.fixture
def datasets_lib(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")   # not the user's cache
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return datasets


def write_jsonl(path, rows: list[dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def test_a_local_dataset_folder_through_load_dataset(datasets_lib, tmp_path):
    """A folder of train/validation files is what load_dataset reads for a Hub name too, once downloaded."""
    folder = tmp_path / "my_dataset"
    write_jsonl(folder / "train.jsonl", [{"translation": {"de": d, "en": e}} for d, e in zip(GERMAN, ENGLISH)])
    write_jsonl(folder / "validation.jsonl", [{"translation": {"de": "Hallo.", "en": "Hello."}}])
    assert load_hub_pairs(str(folder), "train", src_lang="de", tgt_lang="en") == list(zip(GERMAN, ENGLISH))
    assert load_hub_pairs(str(folder), "validation", src_lang="en", tgt_lang="de") == [("Hello.", "Hallo.")]
    with pytest.raises(ValueError, match=r"split 'test'\) could not be loaded"):
        load_hub_pairs(str(folder), "test", src_lang="de", tgt_lang="en")


def test_two_text_columns_by_name(datasets_lib, tmp_path):
    folder = tmp_path / "columns"
    write_jsonl(folder / "train.jsonl", [{"source": d, "target": e, "score": 1} for d, e in zip(GERMAN, ENGLISH)])
    source = DataSource("hub", name=str(folder), src_column="source", tgt_column="target", valid_fraction=0.34,
                        test_fraction=0)
    data = read_source(source)
    assert sorted(data.train + data.valid) == sorted(zip(GERMAN, ENGLISH)) and len(data.valid) == 1
    with pytest.raises(ValueError, match=r"none named \['src'\]; pass two of its columns"):
        load_hub_pairs(str(folder), "train", src_column="src", tgt_column="target")
    with pytest.raises(TypeError, match=r"row 0, field row\['score'\]: a value of type int"):
        load_hub_pairs(str(folder), "train", src_column="source", tgt_column="score")


def test_hub_source_asks_load_dataset_for_name_config_and_split(datasets_lib, monkeypatch):
    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        rows = [{"de": f"{split} {d}", "en": e} for d, e in zip(GERMAN, ENGLISH)]
        return datasets_lib.Dataset.from_list([{"translation": row} for row in rows])

    monkeypatch.setattr(datasets_lib, "load_dataset", fake_load_dataset)
    source = DataSource("hub", name="Helsinki-NLP/opus-100", config="de-en", valid="validation", test="test",
                        src_lang="de", tgt_lang="en")
    data = read_source(source)
    assert calls == [("Helsinki-NLP/opus-100", "de-en", "train"), ("Helsinki-NLP/opus-100", "de-en", "validation"),
                     ("Helsinki-NLP/opus-100", "de-en", "test")]
    assert data.train[0] == ("train " + GERMAN[0], ENGLISH[0]) and data.test[2] == ("test " + GERMAN[2], ENGLISH[2])


# --- the data source of a run ---------------------------------------------------------------------------------

@pytest.fixture
def corpus(tmp_path):
    """40 aligned pairs in two files."""
    src = write(tmp_path / "train.de", text([f"Satz {i}." for i in range(40)]))
    tgt = write(tmp_path / "train.en", text([f"Sentence {i}." for i in range(40)]))
    return src, tgt


def test_carving_is_reproducible_and_keeps_every_pair_once(corpus):
    data = read_source(DataSource("files", train=corpus, valid_fraction=0.1, test_fraction=0.05, seed=3))
    assert (len(data.train), len(data.valid), len(data.test)) == (34, 4, 2)
    everything = data.train + data.valid + data.test
    assert sorted(everything) == sorted(read_parallel_files(*corpus)) and len(set(everything)) == 40
    again = read_source(DataSource("files", train=corpus, valid_fraction=0.1, test_fraction=0.05, seed=3))
    assert again.fingerprint() == data.fingerprint()
    other = read_source(DataSource("files", train=corpus, valid_fraction=0.1, test_fraction=0.05, seed=4))
    assert other.fingerprint()["valid"] != data.fingerprint()["valid"]


def test_given_splits_are_not_carved(corpus, tmp_path):
    valid = (write(tmp_path / "v.de", text(GERMAN)), write(tmp_path / "v.en", text(ENGLISH)))
    data = read_source(DataSource("files", train=corpus, valid=valid, test_fraction=0))
    assert (len(data.train), data.valid, data.test) == (40, list(zip(GERMAN, ENGLISH)), [])


def test_fingerprint_is_of_the_text_not_of_the_files(corpus, tmp_path):
    """The same pairs from gzipped, CRLF, BOM-prefixed files elsewhere, or from a TSV: the same fingerprint."""
    pairs = read_parallel_files(*corpus)
    other = tmp_path / "elsewhere"
    other.mkdir()
    gz = write(other / "t.de.gz", gzip.compress(("\ufeff" + "\r\n".join(s for s, _ in pairs)).encode()))
    crlf = write(other / "t.en", "\r\n".join(t for _, t in pairs).encode())
    tsv = write(other / "t.tsv", text([f"{s}\t{t}" for s, t in pairs]))
    prints = [read_source(DataSource("files", train=corpus, valid_fraction=0.1, test_fraction=0)).fingerprint(),
              read_source(DataSource("files", train=(gz, crlf), valid_fraction=0.1, test_fraction=0)).fingerprint(),
              read_source(DataSource("tsv", train=tsv, valid_fraction=0.1, test_fraction=0)).fingerprint()]
    assert prints[0] == prints[1] == prints[2]
    assert prints[0]["train"]["count"] == 36 and prints[0]["test"] == fingerprint_pairs([])
    # a known value, so that a change of the recipe shows (the run's records would stop matching)
    known = "3a100994c4e38751871e6e8eef9adad2b20177fdeaf650daacdcd74f4c9421e3"   # sha256 of b"a\0b\n"
    assert fingerprint_pairs([("a", "b")])["sha256"] == known


def test_to_dict_is_json_and_from_dict_gives_it_back(corpus):
    source = DataSource("files", train=corpus, valid_fraction=0.1, seed=7)
    recorded = json.loads(json.dumps(source.to_dict()))
    assert recorded["train"] == [str(corpus[0]), str(corpus[1])] and recorded["kind"] == "files"
    assert DataSource.from_dict(recorded) == source
    with pytest.raises(ValueError, match=r"unknown data source field\(s\) \['path'\]"):
        DataSource.from_dict({**recorded, "path": "x"})


def test_builtin_source_reads_the_builtin_splits():
    data = read_source(DataSource())
    assert (len(data.train), len(data.valid), len(data.test)) == (20000, 500, 500)


@pytest.mark.parametrize("fields, error, message", [
    ({"kind": "wmt"}, ValueError, r"kind 'wmt' is not one of \['builtin'"),
    ({"kind": "files"}, ValueError, r"a files data source needs train: \(source file, target file\)"),
    ({"kind": "files", "train": "a.de"}, TypeError, r"train of a files data source must be a \(source file, target"),
    ({"kind": "tsv", "train": "a.tsv", "config": "de-en"}, ValueError, r"config is for hub data sources, not tsv"),
    ({"kind": "multi30k", "train": "a.tsv"}, ValueError, r"multi30k has its own splits"),
    ({"kind": "hub"}, ValueError, r"a hub data source needs name"),
    ({"kind": "builtin", "src_lang": "de"}, ValueError, r"English -> Ordo: it takes no src_lang"),
    ({"kind": "tsv", "train": "a.tsv", "valid_fraction": 1.0}, ValueError,
     r"valid_fraction must be a number in \[0, 1\)"),
    ({"kind": "tsv", "train": "a.tsv", "valid_fraction": 0.5, "test_fraction": 0.5}, ValueError, r"must be below 1"),
    ({"kind": "tsv", "train": "a.tsv", "seed": -1}, ValueError, r"seed must be an int >= 0"),
    ({"kind": "tsv", "train": "a.tsv", "src_column": -1}, TypeError, r"src_column must be a column index from 0"),
    ({"kind": "csv", "train": "a.csv", "delimiter": ";;"}, ValueError, r"delimiter must be one character"),
], ids=["unknown_kind", "files_without_train", "files_one_path", "config_for_tsv", "multi30k_with_paths",
        "hub_without_name", "builtin_with_languages", "fraction_one", "fractions_sum_one", "negative_seed",
        "negative_column", "long_delimiter"])
def test_a_source_that_does_not_fit_its_kind(fields, error, message):
    with pytest.raises(error, match=message):
        DataSource(**fields)


def test_too_few_pairs_to_carve(tmp_path):
    source = DataSource("files", train=(write(tmp_path / "a.de", text(GERMAN[:2])),
                                        write(tmp_path / "a.en", text(ENGLISH[:2]))))
    with pytest.raises(ValueError, match=r"2 training pairs are too few to carve out"):
        read_source(source)


@pytest.mark.parametrize("module", ["readers", "sources"])
def test_the_new_modules_stay_on_the_text_side(module):
    """readers and sources import no model-side module (embeddings, attention, ..., model)."""
    import ast
    import importlib
    from pathlib import Path
    model_side = {"embeddings", "positional", "attention", "multihead", "sublayers", "encoder", "decoder", "model"}
    tree = ast.parse(Path(importlib.import_module(f"transformer_lib.{module}").__file__).read_text(encoding="utf-8"))
    imported = {(node.module or "").split(".")[-1] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name.split(".")[-1] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
    assert not imported & model_side, imported & model_side


# --- one word on a command line --------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, fields, expected", [
    ("builtin", {}, DataSource()),
    ("multi30k", {"src_lang": "en", "tgt_lang": "de"}, DataSource("multi30k", src_lang="en", tgt_lang="de")),
    ("files:a.de,a.en", {"valid": "v.de,v.en"}, DataSource("files", train=("a.de", "a.en"), valid=("v.de", "v.en"))),
    ("files:data/train", {"src_lang": "de", "tgt_lang": "en", "test": "data/test"},
     DataSource("files", train=("data/train.de", "data/train.en"), test=("data/test.de", "data/test.en"),
                src_lang="de", tgt_lang="en")),
    ("tsv:pairs.tsv", {"src_column": 1, "tgt_column": 3},
     DataSource("tsv", train="pairs.tsv", src_column=1, tgt_column=3)),
    ("csv:p.csv", {"header": True}, DataSource("csv", train="p.csv", header=True)),
    ("hub:Helsinki-NLP/opus-100:de-en", {"valid": "validation", "src_lang": "de", "tgt_lang": "en"},
     DataSource("hub", name="Helsinki-NLP/opus-100", config="de-en", valid="validation", src_lang="de", tgt_lang="en")),
    ("hub:bentrevett/multi30k", {"src_column": "de", "tgt_column": "en"},
     DataSource("hub", name="bentrevett/multi30k", src_column="de", tgt_column="en")),
], ids=["builtin", "multi30k", "files_pair", "files_prefix", "tsv", "csv", "hub_config", "hub_columns"])
def test_parse_data_spec(spec, fields, expected):
    assert parse_data_spec(spec, **fields) == expected


@pytest.mark.parametrize("spec, fields, message", [
    ("wmt14", {}, r"data 'wmt14': start with one of builtin, .* e\.g\. files:"),
    ("builtin:x", {}, r"builtin takes nothing after its name"),
    ("tsv:", {}, r"say where the tsv data is after the colon"),
    ("files:a,b,c", {}, r"give two files separated by one comma"),
    ("files:train", {}, r"files:train with de and en reads train\.de and train\.en"),
    ("multi30k", {"valid": "v.de,v.en"}, r"valid is for files, tsv, csv and hub sources"),
], ids=["unknown_kind", "builtin_with_place", "tsv_without_file", "three_files", "prefix_without_languages",
        "multi30k_with_valid"])
def test_parse_data_spec_errors(spec, fields, message):
    with pytest.raises(ValueError, match=message):
        parse_data_spec(spec, **fields)
