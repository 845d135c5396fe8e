"""Your own parallel text on the command line (issue 25): `train --data files:/tsv:/csv:/hub:` and
`evaluate` on the run's carved test split, in-process through `main([...])` on files the tests write.
A run records where its data came from and the fingerprints of its splits; resume refuses other
data; every malformed input is one `error:` line naming the file (and line) with exit code 2, and
leaves no run folder. One tiny training per module fixture; the others train 2 steps each."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from test_cli_errors import assert_refused, cli, snapshot
from transformer_lib.sources import DataSource, fingerprint_pairs, read_source

# A model that trains a step in a fraction of a second.
TINY = ["--vocab-size", "120", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--layers", "1", "--max-len", "32",
        "--max-tokens", "256", "--max-steps", "2", "--validate-every", "10", "--checkpoint-every", "1",
        "--threads", "1", "--device", "cpu", "--no-progress"]
WORDS = ["red", "fox", "sees", "a", "small", "bird", "the", "cat", "runs", "home", "big", "tree"]
# 60 distinct sentence pairs: a German-ish source and its English target, both without commas.
PAIRS = [(" ".join(WORDS[(i * k) % 12] for k in range(1, 2 + i % 5)) + f" {i}", f"Satz {i} " + WORDS[i % 12])
         for i in range(60)]
# What a CSV reader must get right: commas and a newline inside quoted fields, a doubled quote.
CSV_PAIRS = [("Hello, world", 'Hallo, "Welt"'), ("two\nlines", "zwei Zeilen"), *PAIRS[:28]]


def train(run: Path, *extra):
    return cli("train", "--run", run, *TINY, *extra)


def write_files(folder: Path, pairs, stem: str = "train") -> tuple[Path, Path]:
    src, tgt = folder / f"{stem}.en", folder / f"{stem}.de"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return src, tgt


def csv_text(pairs) -> str:
    quote = lambda text: '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text  # noqa
    return "en,de\r\n" + "".join(f"{quote(s)},{quote(t)}\r\n" for s, t in pairs)


def recorded(run: Path) -> dict:
    return json.loads((run / "config.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def files_run(tmp_path_factory) -> Path:
    """A run trained on two aligned files, validation and test carved out (10% each, seed 7)."""
    folder = tmp_path_factory.mktemp("cli_data")
    src, tgt = write_files(folder, PAIRS)
    run = folder / "run"
    result = train(run, "--data", f"files:{src},{tgt}", "--valid-fraction", "0.1", "--test-fraction", "0.1",
                   "--split-seed", "7")
    assert result.returncode == 0, result.stderr
    return run


def test_files_run_records_its_source_and_the_fingerprints_of_its_splits(files_run):
    meta = recorded(files_run)
    source = DataSource.from_dict(meta["source"])
    assert (source.kind, source.seed, source.valid_fraction) == ("files", 7, 0.1) and meta["data"] == "files"
    splits = read_source(source)
    assert {split: meta["fingerprints"][f"{split}_pairs"] for split in ("train", "valid", "test")} \
        == splits.fingerprint()
    assert [meta["fingerprints"][f"{s}_pairs"]["count"] for s in ("train", "valid", "test")] == [48, 6, 6]
    assert sorted(splits.train + splits.valid + splits.test) == sorted(PAIRS)
    identity = torch.load(files_run / "checkpoint.pt", weights_only=True)["extra"]["run"]
    assert identity["source"] == meta["source"] and identity["fingerprints"] == meta["fingerprints"]


def test_evaluate_scores_the_carved_test_split(files_run, tmp_path):
    out = tmp_path / "eval.json"
    result = cli("evaluate", "--run", files_run, "--output", out)
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert (metrics["split"], metrics["sentences"]) == ("test", 6)
    scored = [(t["source"], t["reference"]) for t in json.loads(out.read_text())["translations"]]
    test = read_source(DataSource.from_dict(recorded(files_run)["source"])).test
    assert scored == test and not set(test) & set(read_source(DataSource.from_dict(
        recorded(files_run)["source"])).train)
    again = cli("evaluate", "--run", files_run, "--split", "valid")
    assert again.returncode == 0 and json.loads(again.stdout)["sentences"] == 6, again.stderr


def test_evaluate_on_explicitly_given_files(files_run, tmp_path):
    src, tgt = write_files(tmp_path, PAIRS[:5], "mine")
    result = cli("evaluate", "--run", files_run, "--data", f"files:{src},{tgt}")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sentences"] == 5


def test_evaluate_refuses_a_test_split_whose_files_changed(files_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(files_run, run)
    source = DataSource.from_dict(recorded(run)["source"])
    original = Path(source.train[1]).read_bytes()
    try:
        Path(source.train[1]).write_text("".join(t + " !\n" for _, t in PAIRS), encoding="utf-8")
        assert_refused(cli("evaluate", "--run", run), "test pairs", "config.json", "changed since training")
    finally:
        Path(source.train[1]).write_bytes(original)


@pytest.mark.parametrize("change, words", [
    ("other-train-files", ["training pairs of --data files:", "(40 pairs)", "not those"]),
    ("other-split-seed", ["source.seed 7 -> 8", "--split-seed"]),
    ("other-test-fraction", ["source.test_fraction 0.1 -> 0.2", "--test-fraction"]),
    ("tsv-instead", ["data files -> tsv", "--data"]),
], ids=["other-train-files", "other-split-seed", "other-test-fraction", "tsv-instead"])
def test_resume_on_other_data_is_refused_and_writes_nothing(files_run, tmp_path, change, words):
    run = tmp_path / "run"
    shutil.copytree(files_run, run)
    before = snapshot(run)
    src, tgt = DataSource.from_dict(recorded(run)["source"]).train
    fractions = ["--valid-fraction", "0.1", "--test-fraction", "0.1", "--split-seed", "7"]
    if change == "other-train-files":
        other = write_files(tmp_path, PAIRS[:50], "other")
        extra = ["--data", f"files:{other[0]},{other[1]}", *fractions]
    elif change == "tsv-instead":
        (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
        extra = ["--data", f"tsv:{tmp_path / 'pairs.tsv'}", *fractions]
    else:
        extra = ["--data", f"files:{src},{tgt}", *fractions,
                 *(["--split-seed", "8"] if change == "other-split-seed" else ["--test-fraction", "0.2"])]
    assert_refused(train(run, *extra, "--max-steps", "4"), *words)
    assert snapshot(run) == before


def test_resume_with_the_same_data_moved_elsewhere(files_run, tmp_path):
    """Where the files lie is not compared: the fingerprints of the pairs decide, and the run then records
    where they are now (issue 32), which its checkpoints need not carry (they agree on all else)."""
    run = tmp_path / "run"
    shutil.copytree(files_run, run)
    src, tgt = write_files(tmp_path, PAIRS, "moved")
    result = train(run, "--data", f"files:{src},{tgt}", "--valid-fraction", "0.1", "--test-fraction", "0.1",
                   "--split-seed", "7", "--max-steps", "3")
    assert result.returncode == 0, result.stderr
    assert "resuming" in result.stderr and json.loads(result.stdout)["steps"] == 3
    assert recorded(run)["source"] == {**recorded(files_run)["source"], "train": [str(src), str(tgt)]}
    assert torch.load(run / "checkpoint.pt", weights_only=True)["extra"]["run"]["source"] == recorded(run)["source"]


@pytest.mark.parametrize("kind", ["tsv", "csv"])
def test_train_on_a_table(tmp_path, kind):
    """A TSV with a header and named columns; a CSV whose quoted fields hold commas, a newline and
    quotes, with CRLF line ends: every pair is read as written, none lost."""
    if kind == "tsv":
        table, pairs = tmp_path / "pairs.tsv", PAIRS[:30]
        table.write_text("id\tde\ten\n" + "".join(f"{i}\t{t}\t{s}\n" for i, (s, t) in enumerate(pairs)),
                         encoding="utf-8")
        extra = ["--header", "--src-column", "en", "--tgt-column", "1"]
    else:
        table, pairs = tmp_path / "pairs.csv", CSV_PAIRS
        table.write_bytes(csv_text(pairs).encode("utf-8"))
        extra = ["--header"]
    run = tmp_path / "run"
    result = train(run, "--data", f"{kind}:{table}", *extra)
    assert result.returncode == 0, result.stderr
    meta = recorded(run)
    splits = read_source(DataSource.from_dict(meta["source"]))
    assert sorted(splits.train + splits.valid + splits.test) == sorted(pairs)
    assert meta["fingerprints"]["train_pairs"] == fingerprint_pairs(splits.train)
    assert cli("evaluate", "--run", run).returncode == 0


def test_train_on_a_hub_dataset_through_load_dataset(tmp_path, monkeypatch):
    """A dataset folder as the Hub's datasets library reads it (a downloaded Hub dataset is read by the
    same load_dataset call), with a 'translation' column, its own validation split, languages chosen."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")    # not the user's cache
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = tmp_path / "my_pairs"
    folder.mkdir()
    for split, pairs in (("train", PAIRS[:40]), ("validation", PAIRS[40:45]), ("test", PAIRS[45:50])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"translation": {"en": s, "de": t}}) + "\n"
                                                       for s, t in pairs), encoding="utf-8")
    run = tmp_path / "run"
    result = train(run, "--data", f"hub:{folder}", "--src-lang", "de", "--tgt-lang", "en", "--valid", "validation",
                   "--test", "test")
    assert result.returncode == 0, result.stderr
    prints = recorded(run)["fingerprints"]
    assert prints["train_pairs"] == fingerprint_pairs([(t, s) for s, t in PAIRS[:40]])
    assert prints["test_pairs"] == fingerprint_pairs([(t, s) for s, t in PAIRS[45:50]])
    result = cli("evaluate", "--run", run)
    assert result.returncode == 0 and json.loads(result.stdout)["sentences"] == 5, result.stderr


# --- malformed input: one error line naming the file and line, exit 2, no run folder -------------------------

MALFORMED = {   # id: (files to write {name: bytes}, --data and options, words the error line must hold)
    "unequal-line-counts": ({"a.en": b"a b\nc d\ne f\n", "a.de": b"A B\nC D\n"}, ["files:{d}/a.en,{d}/a.de"],
                            ["a.en has 3 lines", "a.de has 2"]),
    "empty-line": ({"a.en": b"a b\n\ne f\n", "a.de": b"A B\nC D\nE F\n"}, ["files:{d}/a.en,{d}/a.de"],
                   ["a.en, line 2", "empty line"]),
    "not-utf8": ({"a.en": b"a b\nc \xff d\n", "a.de": b"A B\nC D\n"}, ["files:{d}/a.en,{d}/a.de"],
                 ["a.en, line 2", "UTF-8", "iconv"]),
    "control-character": ({"a.en": b"a b\nc\x01d\n", "a.de": b"A B\nC D\n"}, ["files:{d}/a.en,{d}/a.de"],
                          ["a.en, line 2, column 2", "control character"]),
    "utf16": ({"a.en": "a b\nc d\n".encode("utf-16"), "a.de": b"A B\nC D\n"}, ["files:{d}/a.en,{d}/a.de"],
              ["a.en", "UTF-16", "iconv"]),
    "missing-file": ({"a.de": b"A B\n"}, ["files:{d}/nothing.en,{d}/a.de"], ["nothing.en", "no such file"]),
    "prefix-without-languages": ({}, ["files:{d}/train"], ["files:SRC,TGT", "--src-lang and --tgt-lang"]),
    "tsv-short-row": ({"p.tsv": b"a\tA\nb\tB\nc\n"}, ["tsv:{d}/p.tsv"], ["p.tsv, line 3", "1 fields"]),
    "tsv-missing-column": ({"p.tsv": b"a\tA\nb\tB\n"}, ["tsv:{d}/p.tsv", "--src-column", "4"],
                           ["p.tsv", "no column 4"]),
    "tsv-column-not-in-header": ({"p.tsv": b"en\tde\na\tA\n"}, ["tsv:{d}/p.tsv", "--header", "--src-column", "fr"],
                                 ["p.tsv", "no column named 'fr'", "header"]),
    "csv-unclosed-quote": ({"p.csv": b'a,A\n"b,B\nc,C\n'}, ["csv:{d}/p.csv"], ["p.csv, line 2", "quotes"]),
    "csv-empty-field": ({"p.csv": b"a,A\nb,\n"}, ["csv:{d}/p.csv"], ["p.csv, line 2", "empty"]),
    "unknown-kind": ({}, ["xml:{d}/p.xml"], ["--data", "start with one of builtin"]),
    "delimiter-for-tsv": ({"p.tsv": b"a\tA\n"}, ["tsv:{d}/p.tsv", "--delimiter", ";"], ["--delimiter", "csv"]),
    "split-for-builtin": ({}, ["builtin", "--valid", "v.tsv"], ["--valid", "builtin has its own splits"]),
    "fractions-sum-to-one": ({"p.tsv": b"a\tA\n"}, ["tsv:{d}/p.tsv", "--valid-fraction", "0.5", "--test-fraction",
                                                     "0.5"], ["--valid-fraction + --test-fraction", "below 1"]),
    "too-few-to-carve": ({"p.tsv": b"a\tA\nb\tB\n"}, ["tsv:{d}/p.tsv"],
                         ["too few to carve", "--valid-fraction", "--test"]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_is_one_error_line_and_leaves_no_run(tmp_path, case):
    files, options, words = MALFORMED[case]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    spec, *rest = [option.format(d=tmp_path) for option in options]
    run = tmp_path / "run"
    assert_refused(train(run, "--data", spec, *rest), *words)
    assert not run.exists()


def test_a_run_recorded_before_data_sources_still_loads_evaluates_and_resumes(tmp_path):
    """config.json and checkpoint.pt as written before runs recorded "source" and the valid/test
    fingerprints: read as the named corpus it names, and the next save records them."""
    run = tmp_path / "run"
    assert train(run, "--data", "builtin").returncode == 0
    meta = recorded(run)
    del meta["source"], meta["fingerprints"]["valid_pairs"], meta["fingerprints"]["test_pairs"]
    (run / "config.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    checkpoint = torch.load(run / "checkpoint.pt", weights_only=True)
    checkpoint["extra"]["run"].pop("source")
    checkpoint["extra"]["run"]["fingerprints"] = meta["fingerprints"]
    torch.save(checkpoint, run / "checkpoint.pt")
    assert cli("translate", "--run", run, "a queen waited").returncode == 0
    result = cli("evaluate", "--run", run, "--limit", "3")
    assert result.returncode == 0 and json.loads(result.stdout)["sentences"] == 3, result.stderr
    result = train(run, "--data", "builtin", "--max-steps", "3")
    assert result.returncode == 0, result.stderr
    assert recorded(run)["source"]["kind"] == "builtin"
    assert cli("translate", "--run", run, "a queen waited").returncode == 0


def test_settings_take_a_spec_or_a_data_source():
    """The API side of --data: one field, a spec with its options or a DataSource (then alone)."""
    import dataclasses

    from transformer_lib.settings import TrainSettings
    settings = TrainSettings(data="tsv:pairs.tsv", header=True, src_column="2", tgt_column="de", split_seed=5)
    assert settings.source == DataSource("tsv", train="pairs.tsv", header=True, src_column=2, tgt_column="de", seed=5)
    assert dataclasses.replace(settings, max_steps=5).source == settings.source
    own = DataSource("files", train=("a.de", "a.en"), test_fraction=0)
    assert TrainSettings(data=own).source is own
    with pytest.raises(ValueError, match=r"data is a DataSource, so give header in it"):
        TrainSettings(data=own, header=True)
    with pytest.raises(TypeError, match=r"data \(--data\) must be a data source"):
        TrainSettings(data=3)


@pytest.mark.parametrize("extra, words", [
    (["--split", "valid", "--data", "tsv:p.tsv"], ["--split valid", "leave --split out"]),
    (["--split", "test_2016"], ["--split test_2016", "the splits train, valid, test"]),
    (["--data", "tsv:{d}/nothing.tsv"], ["nothing.tsv", "no such file"]),
    (["--data", "files:{d}/a.en"], ["files:SRC,TGT"]),
], ids=["split-with-data", "split-of-another-corpus", "missing-file", "one-file"])
def test_evaluate_bad_data_is_one_error_line(files_run, tmp_path, extra, words):
    assert_refused(cli("evaluate", "--run", files_run, *[e.format(d=tmp_path) for e in extra]), *words)
