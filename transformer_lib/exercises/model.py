"""Checkers for the exercises of notebook 09 (the full Transformer). Hand-written, not exported from a notebook."""
import torch

from torch import nn

from transformer_lib.exercises import Refuse, call, fresh_random, run_checker
from transformer_lib.exercises.explain import name_difference
from transformer_lib.model import EncoderDecoder, Transformer, build_transformer

_BY_FORMULA = "count_parameters must count by formula; building the model (even on the meta device) is what the " \
              "checker does to compare with you"
_NO_MODEL = [Refuse((Transformer, "__init__"), _BY_FORMULA), Refuse((EncoderDecoder, "__init__"), _BY_FORMULA),
             Refuse(build_transformer, _BY_FORMULA), Refuse((nn.Transformer, "__init__"), _BY_FORMULA)]

PAD, BOS, EOS = 0, 1, 2


def _real_count(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings, norm_first) -> int:
    with torch.device("meta"):                    # shapes only: no memory, no random numbers
        model = Transformer(src_vocab_size, tgt_vocab_size, d_model=d_model, n_heads=2, d_ff=d_ff,
                            n_encoder_layers=n_layers, n_decoder_layers=n_layers, norm_first=norm_first,
                            tie_embeddings=tie_embeddings)
    return sum(p.numel() for p in model.parameters())


def check_count_parameters(your_function) -> None:
    """`count_parameters(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings, norm_first)`
    equals the number of parameters of the real model, for tied and untied, post-LN and pre-LN configs."""
    def check(count_parameters):
        cases = [dict(src_vocab_size=37000, tgt_vocab_size=37000, d_model=512, d_ff=2048, n_layers=6),
                 dict(src_vocab_size=100, tgt_vocab_size=100, d_model=16, d_ff=48, n_layers=3),
                 dict(src_vocab_size=100, tgt_vocab_size=100, d_model=16, d_ff=48, n_layers=3, norm_first=True),
                 dict(src_vocab_size=120, tgt_vocab_size=90, d_model=16, d_ff=48, n_layers=2, tie_embeddings=False),
                 dict(src_vocab_size=37000, tgt_vocab_size=37000, d_model=512, d_ff=2048, n_layers=6,
                      tie_embeddings=False, norm_first=True)]
        rng = fresh_random()
        vocab, d_model = rng.randint(200, 5000), 2 * rng.randint(9, 40)    # sizes no fixed case has
        tie = rng.random() < 0.5
        cases.append(dict(src_vocab_size=vocab, tgt_vocab_size=vocab if tie else rng.randint(200, 5000),
                          d_model=d_model, d_ff=rng.randint(10, 100), n_layers=rng.randint(1, 5),
                          tie_embeddings=tie, norm_first=rng.random() < 0.5))
        for case in cases:
            full = dict(tie_embeddings=True, norm_first=False) | case
            expected = _real_count(**full)
            got = call(count_parameters, **full, on=f"sizes {full}", refuse=_NO_MODEL)
            assert isinstance(got, int) or (isinstance(got, torch.Tensor) and got.numel() == 1), \
                f"return a whole number, got {type(got).__name__}"
            got = int(got)
            if got == expected:
                continue
            D, F, N = full["d_model"], full["d_ff"], full["n_layers"]
            V_src, V_tgt = full["src_vocab_size"], full["tgt_vocab_size"]
            hint = ""
            if full["norm_first"] and expected - got == 4 * D:
                hint = "a pre-LN stack ends with one more LayerNorm (gain and bias, 2D each), encoder and decoder"
            elif full["tie_embeddings"] and got - expected in (V_tgt * D, 2 * V_tgt * D):
                hint = ("with tied weights the target embedding and the output layer ARE the source embedding: "
                        "count V·D once")
            elif not full["tie_embeddings"] and expected - got == V_tgt * D:
                hint = "untied, the output layer is a third V_tgt x D matrix (no bias)"
            elif expected - got == N * (4 * D + F + D) + N * (8 * D + F + D):
                hint = "the biases are missing: every attention projection and both feed-forward layers have one"
            elif expected - got == N * (4 * D * D + 4 * D + 2 * D):
                hint = ("the cross-attention is missing: every decoder layer has a second attention (4 D x D "
                        "projections with biases) and a third LayerNorm")
            elif got - expected == 512 * D:
                hint = ("the sinusoidal table (max_len x D) is a fixed buffer, not a parameter: it is not trained "
                        "and not counted")
            elif got - expected == V_tgt:
                hint = "the output layer has no bias (it is the embedding matrix, tied or not)"
            elif expected - got == 3 * N * (D * D + D):    # one projection short in each of the 3N attentions
                hint = "an attention block has FOUR D x D projections (query, key, value and output), each with a bias"
            elif got - expected == N * (D * F + F + F * D + D):
                hint = "an encoder layer has one feed-forward block and a decoder layer one, not two"
            elif expected - got == N * 2 * D * 2 + N * 3 * 2 * D:
                hint = "the LayerNorms are missing: 2D each, two per encoder layer, three per decoder layer"
            elif not full["tie_embeddings"] and got - expected == 2 * (V_src - V_tgt) * D:
                hint = "the untied target embedding and the output layer have tgt_vocab_size rows, not src_vocab_size"
            elif abs(got - expected) in (N * (D + F), 2 * N * (D + F)):
                hint = ("the feed-forward biases: each feed-forward block has d_ff + d_model of them, and every "
                        "encoder layer and every decoder layer has one block")
            elif (got - expected) % (2 * D) == 0 and abs(got - expected) // (2 * D) <= 5 * N + 2:
                k = (got - expected) // (2 * D)
                hint = (f"that is {abs(k)} LayerNorm(s) (2·d_model each) too {'many' if k > 0 else 'few'}: an "
                        "encoder layer has 2, a decoder layer 3, and a pre-LN stack one more at its end")
            if not hint and got > expected and (got - expected) % D == 0:
                hint = (f"that is a table of {(got - expected) // D} rows of d_model more: the sinusoidal positions are "
                        "a buffer (not trained, not counted), and with tied weights the embeddings are counted once")
            raise AssertionError(f"for {full} the model has {expected:,} parameters, your formula gives {got:,} "
                                 f"(off by {got - expected:+,})" + (f": {hint}" if hint else ""))
    run_checker("count_parameters", your_function, check)


def _reference_copy_batch(src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = src.size(0)
    lengths = (src != PAD).sum(1)
    labels = torch.cat([src, torch.full((n, 1), PAD)], dim=1)                  # (B, L + 1)
    labels[torch.arange(n), lengths] = EOS                                     # <eos> right after the symbols
    tgt_in = torch.cat([torch.full((n, 1), BOS), labels[:, :-1]], dim=1)       # shifted right
    return tgt_in.masked_fill(tgt_in == EOS, PAD), labels


def _copy_sources() -> list[torch.Tensor]:
    """The fixed batch, then one drawn afresh (other sizes, lengths and symbols on every call)."""
    fixed = torch.tensor([[5, 9, 3, 0, 0], [7, 4, 11, 12, 6], [8, 0, 0, 0, 0]])
    rng = fresh_random()
    B, L = rng.randint(4, 7), rng.randint(6, 10)                          # never the fixed batch's shape
    drawn = torch.zeros(B, L, dtype=torch.long)
    for row in drawn:
        n = rng.randint(1, L)
        row[:n] = torch.tensor([rng.randint(3, 20) for _ in range(n)])
    return [fixed, drawn]


def _check_copy_on(copy_batch, src: torch.Tensor) -> None:
    B, L = src.shape
    expected_in, expected_labels = _reference_copy_batch(src)
    result = call(copy_batch, src, on=f"src of shape (B, L) = {(B, L)}, padded with 0")
    assert isinstance(result, tuple) and len(result) == 2, "return a pair (decoder input, labels)"
    tgt_in, labels = result
    for name, t in [("decoder input", tgt_in), ("labels", labels)]:
        assert isinstance(t, torch.Tensor) and t.shape == (B, L + 1), \
            f"the {name} must be a tensor of shape (B, L + 1) = {(B, L + 1)}, got {getattr(t, 'shape', t)}"
    if torch.equal(tgt_in, expected_labels) and torch.equal(labels, expected_in):
        raise AssertionError("the pair is swapped: return (decoder input, labels), the decoder input first "
                             "(it starts with <bos> = 1), then the labels (they end with <eos> = 2)")
    reversed_src = src.clone()
    for row, n in zip(reversed_src, (src != PAD).sum(1).tolist()):
        row[:n] = row[:n].flip(0)
    assert torch.equal(labels, expected_labels) or not torch.equal(labels[:, :L], src.flip(1)) and not torch.equal(
        labels, _reference_copy_batch(reversed_src)[1]), "that is reversal; the copy task keeps the order"
    assert not torch.equal(tgt_in, labels), ("the decoder input must be the labels shifted right, starting with "
                                             "<bos> = 1: position t sees the tokens before label t, not label t")
    assert (tgt_in[:, 0] == BOS).all(), f"every decoder input row starts with <bos> = 1, got first column {tgt_in[:, 0].tolist()}"
    if torch.equal(labels[:, 1:], expected_labels[:, :-1]) and (labels[:, 0] == BOS).all():
        raise AssertionError("the labels start with <bos>; <bos> is only fed to the decoder. The labels are the "
                             "symbols themselves, then <eos> = 2: label t is what position t must predict")
    if (labels == -100).any() and torch.equal(labels.masked_fill(labels == -100, PAD), expected_labels):
        raise AssertionError("the labels pad with -100; the course pads them with <pad> = 0 (the loss ignores pad_id)")
    if torch.equal(labels[:, :-1], expected_labels[:, 1:]):
        raise AssertionError("your labels lost the first symbol: label t is symbol t (then <eos>); it is the "
                             "decoder input that is shifted right, behind <bos>")
    assert (labels == EOS).sum(1).eq(1).all(), \
        f"each label row needs exactly one <eos> = 2 after the symbols, got\n{labels}"
    assert not (tgt_in == EOS).any(), "<eos> is never fed to the decoder: replace it by <pad> in the decoder input"
    at_row_end = torch.cat([src, torch.full((B, 1), EOS)], dim=1)
    if torch.equal(labels, at_row_end):
        raise AssertionError("<eos> must come right after each sentence's last symbol, not at the end of the "
                             "padded row: labels[b, length_b] = 2, then <pad>")
    name_difference(labels, expected_labels, f"the labels for src {tuple(src.shape)}: ", "; label rows are the "
                    "symbols, then <eos> = 2, then <pad> = 0")
    name_difference(tgt_in, expected_in, f"the decoder input for "
                    f"src {tuple(src.shape)}: ", "; it is <bos> = 1, then the labels shifted right, without <eos>")
    assert torch.equal(labels, expected_labels), f"labels should be\n{expected_labels}\ngot\n{labels}"
    assert torch.equal(tgt_in, expected_in), f"the decoder input should be\n{expected_in}\ngot\n{tgt_in}"


def check_copy_batch(your_function) -> None:
    """`copy_batch(src)` -> (decoder input, labels) for the copy task, as `reversal_batch` builds them."""
    def check(copy_batch):
        for src in _copy_sources():
            _check_copy_on(copy_batch, src)
    run_checker("copy_batch", your_function, check)
