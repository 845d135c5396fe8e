"""The checkers of notebook 09's exercises: plausible wrong answers -> AssertionError
with a message that says what is wrong, right answers -> True.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import pytest
import torch

from transformer_lib.exercises.model import check_copy_batch, check_count_parameters


def count(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings=True, norm_first=False,
          biases=True, final_norms=True, tied_generator_counted=False):
    D, F, N = d_model, d_ff, n_layers
    attention = 4 * D * D + (4 * D if biases else 0)
    ffn = 2 * D * F + ((F + D) if biases else 0)
    layers = N * (attention + ffn + 2 * 2 * D) + N * (2 * attention + ffn + 3 * 2 * D)
    if norm_first and final_norms:
        layers += 2 * 2 * D
    if tie_embeddings:
        embeddings = src_vocab_size * D + (tgt_vocab_size * D if tied_generator_counted else 0)
    else:
        embeddings = src_vocab_size * D + 2 * tgt_vocab_size * D
    return layers + embeddings


def test_count_parameters_right(capsys):
    assert check_count_parameters(count) is True
    assert "correct: count_parameters" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [
    (lambda *a, **k: count(*a, **k, final_norms=False), "one more LayerNorm"),
    (lambda *a, **k: count(*a, **k, tied_generator_counted=True), "count V·D once"),
    (lambda *a, **k: count(*a, **k, biases=False), "biases are missing"),
])
def test_count_parameters_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_count_parameters(wrong)


def right_copy_batch(src):
    n, lengths = src.size(0), (src != 0).sum(1)
    labels = torch.cat([src, torch.zeros(n, 1, dtype=src.dtype)], dim=1)
    labels[torch.arange(n), lengths] = 2
    tgt_in = torch.cat([torch.ones(n, 1, dtype=src.dtype), labels[:, :-1]], dim=1)
    return tgt_in.masked_fill(tgt_in == 2, 0), labels


def not_shifted(src):
    _, labels = right_copy_batch(src)
    return labels.clone(), labels


def eos_fed(src):
    n = src.size(0)
    _, labels = right_copy_batch(src)
    return torch.cat([torch.ones(n, 1, dtype=src.dtype), labels[:, :-1]], dim=1), labels


def reversed_batch(src):
    lengths = (src != 0).sum(1)
    position = torch.arange(src.size(1))[None]
    index = (lengths[:, None] - 1 - position).clamp(min=0)
    flipped = src.gather(1, index).masked_fill(position >= lengths[:, None], 0)
    return right_copy_batch(flipped)


def test_copy_batch_right(capsys):
    assert check_copy_batch(right_copy_batch) is True
    assert "correct: copy_batch" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [(not_shifted, "shifted right"), (eos_fed, "never fed"),
                                            (lambda src: (src, src), r"shape \(B, L \+ 1\)")])
def test_copy_batch_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_copy_batch(wrong)


def test_copy_batch_reversal_is_wrong():
    # the reversal of a source whose rows are not palindromes is caught with its own message
    with pytest.raises(AssertionError):
        check_copy_batch(reversed_batch)
