"""The checkers of notebook 09's exercises: plausible wrong answers -> AssertionError
with a message that says what is wrong, right answers (several ways of writing them) -> "correct".
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import pytest
import torch

from transformer_lib.exercises.model import check_copy_batch, check_count_parameters


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



def count(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings=True, norm_first=False,
          biases=True, final_norms=True, tied_generator_counted=False, cross_attention=True, norms=True,
          positions=False, generator_bias=False, projections=4, untied_generator=True):
    D, F, N = d_model, d_ff, n_layers
    attention = projections * D * D + (projections * D if biases else 0)
    ffn = 2 * D * F + ((F + D) if biases else 0)
    norm = 2 * D if norms else 0
    layers = N * (attention + ffn + 2 * norm) + N * ((2 if cross_attention else 1) * attention + ffn
                                                      + (3 if cross_attention else 2) * norm)
    if norm_first and final_norms:
        layers += 2 * 2 * D
    if tie_embeddings:
        embeddings = src_vocab_size * D + (tgt_vocab_size * D if tied_generator_counted else 0)
    else:
        embeddings = src_vocab_size * D + (2 if untied_generator else 1) * tgt_vocab_size * D
    return layers + embeddings + (512 * D if positions else 0) + (tgt_vocab_size if generator_bias else 0)


def count_with_meta_model(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings=True,
                          norm_first=False):
    """A shortcut the exercise forbids (it asks for a formula): count a model's own parameters."""
    from transformer_lib.model import Transformer
    with torch.device("meta"):
        model = Transformer(src_vocab_size, tgt_vocab_size, d_model=d_model, n_heads=1, d_ff=d_ff,
                            n_encoder_layers=n_layers, n_decoder_layers=n_layers, norm_first=norm_first,
                            tie_embeddings=tie_embeddings)
    return torch.tensor(sum(p.numel() for p in model.parameters()))


@pytest.mark.parametrize("right", [count])
def test_count_parameters_right(right):
    assert accepted(check_count_parameters, right)


@pytest.mark.parametrize("wrong, message", [
    (lambda *a, **k: count(*a, **k, final_norms=False), "one more LayerNorm"),
    (lambda *a, **k: count(*a, **k, tied_generator_counted=True), "count V·D once"),
    (lambda *a, **k: count(*a, **k, biases=False), "biases are missing"),
    (lambda *a, **k: count(*a, **k, cross_attention=False), "cross-attention is missing"),
    (lambda *a, **k: count(*a, **k, norms=False), "LayerNorms are missing"),
    (lambda *a, **k: count(*a, **k, positions=True), "sinusoidal table"),
    (lambda *a, **k: count(*a, **k, generator_bias=True), "no bias"),
    (lambda *a, **k: count(*a, **k, projections=3), "FOUR D x D projections"),
    (lambda *a, **k: count(*a, **k, untied_generator=False), "third V_tgt x D matrix"),
    (lambda *a, **k: float(count(*a, **k)), "whole number"),
    (lambda s, t, d, f, n: count(s, t, d, f, n), "raised TypeError"),
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


def copy_batch_loops(src):
    rows_in, rows_out = [], []
    for row in src.tolist():
        symbols = [t for t in row if t != 0]
        labels = symbols + [2] + [0] * (len(row) - len(symbols))
        rows_out.append(labels)
        rows_in.append([1] + symbols + [0] * (len(row) - len(symbols)))
    return torch.tensor(rows_in, dtype=src.dtype), torch.tensor(rows_out, dtype=src.dtype)


def eos_at_row_end(src):
    labels = torch.cat([src, torch.full((src.size(0), 1), 2)], dim=1)
    return torch.cat([torch.ones(src.size(0), 1, dtype=src.dtype), src], dim=1), labels


def in_place_src(src):
    src[src == 0] = 0
    src.add_(0)
    src[:, 0] = src[:, 0]
    out = right_copy_batch(src.clone())
    src.fill_(0)
    return out


@pytest.mark.parametrize("right", [right_copy_batch, copy_batch_loops])
def test_copy_batch_right(right):
    assert accepted(check_copy_batch, right)


@pytest.mark.parametrize("wrong, message", [(not_shifted, "shifted right"), (eos_fed, "never fed"),
                                            (lambda src: (src, src), r"shape \(B, L \+ 1\)"),
                                            (reversed_batch, "that is reversal"),
                                            (eos_at_row_end, "not at the end of the padded row"),
                                            (in_place_src, "changed its input `src` in place"),
                                            (lambda src: right_copy_batch(src)[1], "return a pair")])
def test_copy_batch_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_copy_batch(wrong)



def count_per_layer(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings=True, norm_first=False):
    """Another right answer: block by block, as a reader of §3 would add them up."""
    attention = 4 * (d_model * d_model + d_model)
    feed_forward = d_model * d_ff + d_ff + d_ff * d_model + d_model
    layer_norm = 2 * d_model
    encoder = n_layers * (attention + feed_forward + 2 * layer_norm) + (layer_norm if norm_first else 0)
    decoder = n_layers * (2 * attention + feed_forward + 3 * layer_norm) + (layer_norm if norm_first else 0)
    tables = src_vocab_size * d_model if tie_embeddings else (src_vocab_size + 2 * tgt_vocab_size) * d_model
    return encoder + decoder + tables


def count_memorised(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings=True, norm_first=False):
    """A table of the fixed cases' answers."""
    return {(37000, True, False): 63082496, (100, True, False): 21472, (100, True, True): 21536,
            (120, False, False): 18048, (37000, False, True): 100972544}.get(
        (src_vocab_size, tie_embeddings, norm_first), 0)


def test_count_parameters_right_per_layer():
    assert accepted(check_count_parameters, count_per_layer)


@pytest.mark.parametrize("wrong, message", [
    (count_with_meta_model, "must count by formula"),
    (count_memorised, "the model has"),
])
def test_count_parameters_shortcuts_refused(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_count_parameters(wrong)


def memorised_copy(src):
    return (torch.tensor([[1, 5, 9, 3, 0, 0], [1, 7, 4, 11, 12, 6], [1, 8, 0, 0, 0, 0]]),
            torch.tensor([[5, 9, 3, 2, 0, 0], [7, 4, 11, 12, 6, 2], [8, 2, 0, 0, 0, 0]]))


def labels_with_bos(src):
    tgt_in, labels = right_copy_batch(src)
    return tgt_in, torch.cat([torch.ones(src.size(0), 1, dtype=src.dtype), labels[:, :-1]], dim=1)


@pytest.mark.parametrize("wrong, message", [
    (lambda src: right_copy_batch(src)[::-1], "the pair is swapped"),
    (memorised_copy, "shape \\(B, L \\+ 1\\)"),
    (labels_with_bos, "the labels start with <bos>"),
    (lambda src: (right_copy_batch(src)[0].clamp(max=src.max()) * 0, right_copy_batch(src)[1]), "starts with <bos>"),
])
def test_copy_batch_more_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_copy_batch(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda src: (right_copy_batch(src)[0], right_copy_batch(src)[1].masked_fill(right_copy_batch(src)[1] == 0, -100)),
     "pad with -100"),
    (lambda src: (right_copy_batch(src)[0], torch.cat([right_copy_batch(src)[1][:, 1:],
                                                       torch.zeros(src.size(0), 1, dtype=src.dtype)], 1)),
     "lost the first symbol"),
])
def test_copy_batch_named_beyond_the_issue(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_copy_batch(wrong)


def test_count_parameters_layer_norm_count_is_named():
    with pytest.raises(AssertionError, match="n_layers LayerNorms too many"):
        check_count_parameters(lambda **k: count(**k) + 2 * k["d_model"] * k["n_layers"])


# ---------------------------------------------------------------- fresh4: the untied output layer
def count_untied_generator(generator_rows="tgt", bias=False):
    def count_parameters(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings=True,
                         norm_first=False):
        total = count(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings, norm_first)
        if tie_embeddings:
            return total
        rows = src_vocab_size if generator_rows == "src" else tgt_vocab_size
        return total + (rows - tgt_vocab_size) * d_model + (rows if bias else 0)
    return count_parameters


@pytest.mark.parametrize("wrong, message", [
    (count_untied_generator(bias=True), "untied, the output layer is its own V_tgt x D matrix, still without a bias"),
    (count_untied_generator(generator_rows="src"), "the target embedding or the output layer, has src_vocab_size rows"),
])
def test_count_parameters_untied_output_layer_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_count_parameters(wrong)
