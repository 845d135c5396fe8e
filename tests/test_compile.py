"""torch.compile for training and decoding (`train --compile`, `translate/evaluate --compile`,
`transformer_lib.decoding.compile_for_decoding`): the compiled model computes what the eager one does.

torch.compile writes C++ on a CPU, so these tests need a C++ compiler (Linux CI has g++); they are
skipped where there is none. Each compilation takes tens of seconds, so the models are tiny."""
import json
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.cli import main
from transformer_lib.decoding import compile_for_decoding
from transformer_lib.model import Transformer

pytestmark = pytest.mark.skipif(sys.platform != "linux" or shutil.which("g++") is None,
                                reason="torch.compile on a CPU needs a C++ compiler (tested on Linux with g++)")


def test_compile_for_decoding_refuses_what_cannot_decode():
    with pytest.raises(TypeError, match="encode and decode"):
        compile_for_decoding(torch.nn.Linear(2, 2))


def test_cli_compile_trains_and_translates_like_eager(tmp_path, capsys):
    """`train --compile` (inductor, dynamic shapes, batches of several shapes) takes the eager steps, and its
    checkpoint keeps the eager names; `translate --compile` gives the eager tokens, greedy and with a beam.
    One test for all of it: each compilation costs seconds, and the tests share none."""
    tiny = ["--data", "builtin", "--vocab-size", "200", "--d-model", "16", "--heads", "2", "--d-ff", "32",
            "--layers", "1", "--max-tokens", "256", "--max-steps", "10", "--dropout", "0", "--threads", "1",
            "--device", "cpu", "--no-progress", "--validate-every", "0"]
    for name, extra in (("eager", ["--pad-to-multiple", "8"]), ("compiled", ["--compile"])):   # the same batches
        assert main(["train", "--run", str(tmp_path / name), *tiny, *extra]) == 0
    capsys.readouterr()
    histories = {name: json.loads((tmp_path / name / "history.json").read_text())["history"]
                 for name in ("eager", "compiled")}
    torch.testing.assert_close([h["loss"] for h in histories["compiled"]], [h["loss"] for h in histories["eager"]],
                               atol=1e-4, rtol=1e-4)
    sentences = ["the cat sees the dog .", "a bird sings .", "the dog runs ."]
    assert main(["translate", "--run", str(tmp_path / "compiled"), "--device", "cpu", *sentences]) == 0   # eager names
    capsys.readouterr()
    for beam in ("1", "3"):
        outputs = {}
        for name, extra in (("eager", []), ("compiled", ["--compile"])):
            assert main(["translate", "--run", str(tmp_path / "eager"), "--device", "cpu", "--beam", beam,
                         *extra, *sentences]) == 0
            outputs[name] = capsys.readouterr().out
        assert outputs["compiled"] == outputs["eager"] and outputs["eager"].count("\n") == 3, beam


# --- pad_to_multiple: a compiled model sees few shapes (issue 17) -------------------------------------

VOCAB, MAX_LEN = 120, 32


def padded_epochs(multiple: int, n_pairs: int = 300, max_tokens: int = 1024):
    """One epoch of TranslationData batches over the built-in corpus's first `n_pairs`."""
    from transformer_lib.data import TranslationData, load_pairs
    from transformer_lib.tokenization import train_bpe_tokenizer
    pairs = load_pairs("builtin", "train", limit=n_pairs)
    tokenizer = train_bpe_tokenizer([text for pair in pairs for text in pair], vocab_size=VOCAB)
    data = TranslationData(pairs, tokenizer, max_tokens=max_tokens, max_len=MAX_LEN, pad_to_multiple=multiple)
    return data.batches(), tokenizer


def count_graphs(batches, pad_id: int, dynamic: bool, backend: str = "inductor", stop_above: int | None = None):
    """Train a fresh tiny compiled model on `batches`; the number of graphs dynamo compiled after each step."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Transformer(VOCAB, VOCAB, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                        dropout=0.0, max_len=MAX_LEN)
    model.compile(dynamic=dynamic, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    graphs = []
    with torch._dynamo.config.patch(recompile_limit=1000):      # count them all, never fall back to eager
        for batch in batches:
            logits = model(batch.src, batch.tgt_in, batch.src_key_padding_mask, batch.tgt_key_padding_mask)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch.tgt_out.reshape(-1), ignore_index=pad_id)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            graphs.append(counters["stats"]["unique_graphs"])
            if stop_above is not None and graphs[-1] > stop_above:
                break
    torch._dynamo.reset()
    return graphs


def shapes(batches) -> set:
    return {(tuple(b.src.shape), tuple(b.tgt_in.shape)) for b in batches}


def test_pad_to_multiple_bounds_the_graphs_of_a_static_compile():
    """dynamic=False compiles one set of graphs per batch shape: padding S and T to a multiple of 8 (and the
    budget counting the padded lengths, which bounds B too) gives few shapes and so few graphs. The count is
    dynamo's, the same for every backend, so the fast "eager" backend stands in for inductor here."""
    padded, tokenizer = padded_epochs(8)
    assert all(b.src.size(1) % 8 == 0 and b.tgt_in.size(1) % 8 == 0 for b in padded)
    graphs = count_graphs(padded, tokenizer.pad_id, dynamic=False, backend="eager")
    per_shape = graphs[0]                              # graph breaks make a forward more than one graph
    assert graphs[-1] <= per_shape * len(shapes(padded)), (graphs, len(shapes(padded)))
    plain, _ = padded_epochs(1)
    assert len(shapes(plain)) > len(shapes(padded))
    # Without padding the same examples recompile for nearly every batch: stop once it has passed the padded count.
    unpadded = count_graphs(plain, tokenizer.pad_id, dynamic=False, backend="eager", stop_above=graphs[-1])
    assert unpadded[-1] > graphs[-1], (unpadded, graphs)


def test_pad_to_multiple_with_dynamic_shapes_compiles_a_bounded_number_of_graphs():
    """`train --compile` compiles with dynamic=True: padded batches of every shape are served by one set of
    graphs (dynamo may add a few while it learns which sizes vary), never one set per shape. As above the
    "eager" backend stands in for inductor (both gave 12 graphs on these batches with torch 2.13);
    test_cli_compile_trains_and_translates_like_eager checks inductor's dynamic graphs against eager PyTorch."""
    padded, tokenizer = padded_epochs(8)
    graphs = count_graphs(padded, tokenizer.pad_id, dynamic=True, backend="eager")
    assert len(shapes(padded)) >= 3, "the test needs batches of several shapes"
    assert graphs[-1] <= 2 * graphs[0] < graphs[0] * len(shapes(padded)), (graphs, len(shapes(padded)))
