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
from transformer_lib.decoding import beam_search, compile_for_decoding, greedy_decode
from transformer_lib.model import Transformer

pytestmark = pytest.mark.skipif(sys.platform != "linux" or shutil.which("g++") is None,
                                reason="torch.compile on a CPU needs a C++ compiler (tested on Linux with g++)")

V, PAD, BOS, EOS = 60, 0, 1, 2


def tiny_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(V, V, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                       dropout=0.0, max_len=32)


def batch(seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (4, 9), generator=generator)
    tgt = torch.randint(3, V, (4, 7), generator=generator)
    src[2:, 6:] = PAD
    tgt[2:, 5:] = PAD
    return src, tgt, src == PAD, tgt == PAD


def test_compiled_training_steps_match_eager():
    eager, compiled = tiny_model(), tiny_model()
    compiled.compile(dynamic=True)                   # as `train --compile` does
    assert list(compiled.state_dict()) == list(eager.state_dict())   # checkpoints keep their names
    losses = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        # SGD, not Adam: the key bias gets a gradient that is zero up to rounding (softmax ignores it),
        # which Adam would blow up to a full-size step of either sign.
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses[name] = []
        for seed in (1, 2, 3):                         # three shapes of batch: one graph, dynamic shapes
            src, tgt, src_pad, tgt_pad = batch(seed)
            logits = model(src[:, : 9 - seed], tgt, src_pad[:, : 9 - seed], tgt_pad)
            loss = F.cross_entropy(logits.reshape(-1, V), tgt.roll(-1, dims=1).reshape(-1), ignore_index=PAD)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses[name].append(loss.item())
    torch.testing.assert_close(losses["compiled"], losses["eager"], atol=1e-5, rtol=1e-5)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(p_compiled, p_eager, atol=1e-5, rtol=1e-5, msg=name)


def test_compiled_decoding_gives_the_same_tokens():
    eager, compiled = tiny_model().eval(), compile_for_decoding(tiny_model().eval())
    src, _, src_pad, _ = batch()
    for decode in (lambda m: greedy_decode(m, src, src_pad, BOS, EOS, max_len=12),
                   lambda m: beam_search(m, src, src_pad, BOS, EOS, beam_size=3, max_len=12)):
        assert decode(compiled) == decode(eager)
    assert list(compiled.state_dict()) == list(eager.state_dict())


def test_compile_for_decoding_refuses_what_cannot_decode():
    with pytest.raises(TypeError, match="encode and decode"):
        compile_for_decoding(torch.nn.Linear(2, 2))


def test_cli_compile_trains_and_translates_like_eager(tmp_path, capsys):
    tiny = ["--data", "builtin", "--vocab-size", "200", "--d-model", "16", "--heads", "2", "--d-ff", "32",
            "--layers", "1", "--max-tokens", "256", "--max-steps", "10", "--dropout", "0", "--threads", "1",
            "--device", "cpu", "--no-progress", "--validate-every", "0"]
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        assert main(["train", "--run", str(tmp_path / name), *tiny, *extra]) == 0
    capsys.readouterr()
    histories = {name: json.loads((tmp_path / name / "history.json").read_text())["history"]
                 for name in ("eager", "compiled")}
    torch.testing.assert_close([h["loss"] for h in histories["compiled"]], [h["loss"] for h in histories["eager"]],
                               atol=1e-4, rtol=1e-4)
    sentences = ["the cat sees the dog .", "a bird sings ."]
    outputs = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        assert main(["translate", "--run", str(tmp_path / "eager"), "--device", "cpu", *extra, *sentences]) == 0
        outputs[name] = capsys.readouterr().out
    assert outputs["compiled"] == outputs["eager"] and outputs["eager"].count("\n") == 2
