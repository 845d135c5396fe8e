"""Tests for transformer_lib.embeddings (notebook 02): TokenEmbedding."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.embeddings import TokenEmbedding

CONFIGS = [(10, 4, None), (10, 4, 0), (37, 16, 3)]  # (vocab_size, d_model, padding_idx)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def tokens():
    torch.manual_seed(0)
    return torch.randint(0, 10, (3, 7))  # (B, L)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab_size, d_model, padding_idx", CONFIGS)
def test_equals_scaled_nn_embedding(vocab_size, d_model, padding_idx, device):
    torch.manual_seed(0)
    embed = TokenEmbedding(vocab_size, d_model, padding_idx).to(device)
    reference = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx).to(device)
    with torch.no_grad():
        reference.weight.copy_(embed.embedding.weight)
    tokens = torch.randint(0, vocab_size, (2, 9), device=device)
    out = embed(tokens)
    assert out.shape == (2, 9, d_model)
    torch.testing.assert_close(out, reference(tokens) * math.sqrt(d_model))


def test_one_hot_times_weight(tokens):
    embed = TokenEmbedding(10, 4)
    one_hot = F.one_hot(tokens, num_classes=10).float()                 # (B, L, V)
    expected = one_hot @ embed.embedding.weight * math.sqrt(4)          # (B, L, D)
    torch.testing.assert_close(embed(tokens), expected)


def test_int32_and_any_shape():
    embed = TokenEmbedding(10, 4)
    ids = torch.tensor([[[1, 2], [3, 4]]], dtype=torch.int32)           # (1, 2, 2)
    torch.testing.assert_close(embed(ids), embed(ids.long()))
    assert embed(ids).shape == (1, 2, 2, 4)
    assert embed(torch.zeros(0, 5, dtype=torch.long)).shape == (0, 5, 4)


def test_init_scale():
    torch.manual_seed(0)
    d_model = 256
    embed = TokenEmbedding(2000, d_model)
    weight_std = embed.embedding.weight.std().item()
    assert abs(weight_std - d_model ** -0.5) < 0.02 * d_model ** -0.5
    out = embed(torch.arange(2000).unsqueeze(0))                        # (1, V, D)
    assert abs(out.std().item() - 1.0) < 0.02                           # unit variance after the scale


def test_gradient_only_to_used_rows():
    embed = TokenEmbedding(10, 4)
    tokens = torch.tensor([[1, 5, 5, 8]])
    embed(tokens).sum().backward()
    grad = embed.embedding.weight.grad
    used = {1, 5, 8}
    for row in range(10):
        assert (grad[row].abs().sum() > 0) == (row in used), f"row {row}"
    # each occurrence contributes sqrt(d_model) per entry; token 5 occurs twice
    torch.testing.assert_close(grad[5], torch.full((4,), 2 * math.sqrt(4)))


def test_padding_row_zero_and_frozen():
    embed = TokenEmbedding(10, 4, padding_idx=2)
    assert torch.equal(embed.embedding.weight[2], torch.zeros(4))
    tokens = torch.tensor([[2, 3, 2, 7]])
    out = embed(tokens)
    assert torch.equal(out[0, 0], torch.zeros(4)) and torch.equal(out[0, 2], torch.zeros(4))
    out.pow(2).sum().backward()
    grad = embed.embedding.weight.grad
    assert torch.equal(grad[2], torch.zeros(4))
    assert grad[3].abs().sum() > 0 and grad[7].abs().sum() > 0


def test_reset_parameters_keeps_padding_zero():
    embed = TokenEmbedding(10, 4, padding_idx=0)
    with torch.no_grad():
        embed.embedding.weight.fill_(1.0)
    embed.reset_parameters()
    assert torch.equal(embed.embedding.weight[0], torch.zeros(4))
    assert embed.embedding.weight[1:].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool, torch.uint8])
def test_non_integer_tokens_raise_type_error(dtype):
    embed = TokenEmbedding(10, 4)
    with pytest.raises(TypeError, match=str(dtype)):
        embed(torch.zeros(2, 3, dtype=dtype))


def test_non_tensor_tokens_raise_type_error():
    with pytest.raises(TypeError, match="torch.Tensor"):
        TokenEmbedding(10, 4)([[1, 2, 3]])


@pytest.mark.parametrize("ids, match", [([[1, 10, 3]], r"max id 10"), ([[-1, 2]], r"min id -1"),
                                        ([[0, 250]], r"max id 250")])
def test_out_of_range_ids_raise_value_error(ids, match):
    embed = TokenEmbedding(10, 4)
    with pytest.raises(ValueError, match=match) as info:
        embed(torch.tensor(ids))
    assert "vocab_size=10" in str(info.value)


@pytest.mark.parametrize("vocab_size, d_model, padding_idx, match", [
    (0, 4, None, "vocab_size"), (-3, 4, None, "vocab_size"), (10.0, 4, None, "vocab_size"),
    (True, 4, None, "vocab_size"), (10, 0, None, "d_model"), (10, 2.5, None, "d_model"),
    (10, 4, 10, "padding_idx"), (10, 4, -1, "padding_idx"), (10, 4, 1.0, "padding_idx"),
])
def test_bad_constructor_args_raise_value_error(vocab_size, d_model, padding_idx, match):
    with pytest.raises(ValueError, match=match):
        TokenEmbedding(vocab_size, d_model, padding_idx)


# ---------------------------------------------------------------- the id check inside a training step
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy")


def test_id_check_inside_a_trainer_step_reads_nothing_and_is_recorded(monkeypatch):
    """A Trainer step must never wait for the GPU: inside `deferred_id_checks` the range check stays on
    the device, wrong ids are looked up as id 0 (never outside the table), and the check is recorded."""
    from transformer_lib.device import deferred_id_checks
    embed = TokenEmbedding(10, 4)
    tokens = torch.tensor([[1, 12, 3], [4, 5, -1]])
    reads = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k: (reads.append(_n),
                                                                                               _o(self, *a, **k))[1])
    with deferred_id_checks() as found:
        out = embed(tokens)
    monkeypatch.undo()
    assert reads == []
    torch.testing.assert_close(out[0, 1], embed.embedding.weight[0] * 2.0)      # id 12 looked up as 0
    (any_wrong, first, vocab_size, what), = found
    assert bool(any_wrong) and int(first) == 12 and vocab_size == 10 and what == "token id"


def test_id_check_outside_a_step_raises_at_once():
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 10\).*max id 12"):
        TokenEmbedding(10, 4)(torch.tensor([[1, 12]]))


def test_a_whole_transformer_step_reads_nothing_from_the_device():
    """The model side adds no host read to a Trainer step: build_transformer + translation_loss, host
    reads counted in the steps of fit outside its log steps and guard reports (notebook 11's Trainer)."""
    from transformer_lib.data import Batch
    from transformer_lib.model import TransformerConfig, build_transformer
    from transformer_lib.training import LabelSmoothingLoss, Trainer, make_optimizer, translation_loss
    pairs = [([4, 5, 6, 7][: 1 + i % 4], [1] + [3 + (i + j) % 7 for j in range(1 + i % 3)] + [2]) for i in range(32)]
    batches = [Batch.from_examples(pairs[i:i + 8], pad_id=0) for i in range(0, 32, 8)]
    torch.manual_seed(0)
    model = build_transformer(TransformerConfig(12, 12, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                                                n_decoder_layers=1, max_len=16))
    optimizer, scheduler = make_optimizer(model, d_model=16, warmup_steps=4)
    criterion = LabelSmoothingLoss(0.1, ignore_index=0)
    trainer = Trainer(model, lambda m, b: translation_loss(m, b, criterion), optimizer, lambda epoch: batches,
                      scheduler, max_steps=8, log_every=4, progress=False)
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        pytest.skip("this PyTorch has no fused Adam on the CPU (torch < 2.4): the guard reads its flag on the host")
    reads, logging = [], [0]

    def allowing(method):                      # the log steps and the guard's report may read
        def run(*args, **kwargs):
            logging[0] += 1
            try:
                return method(*args, **kwargs)
            finally:
                logging[0] -= 1
        return run
    trainer._log, trainer._raise_on_fault = allowing(trainer._log), allowing(trainer._raise_on_fault)
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(name):
        def read(self, *args, **kwargs):
            if not logging[0]:
                reads.append((name, trainer.state.step))
            return originals[name](self, *args, **kwargs)
        return read
    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, counted(name))
        trainer.fit()
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
    assert reads == [], f"host reads inside training steps: {reads[:10]}"
    assert [h["step"] for h in trainer.state.history] == [4, 8]
