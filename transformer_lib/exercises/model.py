"""Checkers for the exercises of notebook 09 (the full Transformer). Hand-written, not exported from a notebook."""
import torch

from transformer_lib.exercises import call, run_checker
from transformer_lib.model import Transformer

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
        for case in cases:
            full = dict(tie_embeddings=True, norm_first=False) | case
            expected = _real_count(**full)
            got = call(count_parameters, **full, on=f"sizes {full}")
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


def check_copy_batch(your_function) -> None:
    """`copy_batch(src)` -> (decoder input, labels) for the copy task, as `reversal_batch` builds them."""
    def check(copy_batch):
        src = torch.tensor([[5, 9, 3, 0, 0], [7, 4, 11, 12, 6], [8, 0, 0, 0, 0]])
        expected_in, expected_labels = _reference_copy_batch(src)
        src_in = src.clone()
        result = call(copy_batch, src_in, on=f"src of shape (B, L) = {tuple(src.shape)}, padded with 0")
        assert torch.equal(src_in, src), "copy_batch changed src in place; build new tensors"
        assert isinstance(result, tuple) and len(result) == 2, "return a pair (decoder input, labels)"
        tgt_in, labels = result
        for name, t in [("decoder input", tgt_in), ("labels", labels)]:
            assert isinstance(t, torch.Tensor) and t.shape == (3, 6), \
                f"the {name} must be a tensor of shape (B, L + 1) = (3, 6), got {getattr(t, 'shape', t)}"
        reversed_src = src.clone()
        for row, n in zip(reversed_src, (src != PAD).sum(1).tolist()):
            row[:n] = row[:n].flip(0)
        assert not torch.equal(labels[:, :5], src.flip(1)) and not torch.equal(
            labels, _reference_copy_batch(reversed_src)[1]), "that is reversal; the copy task keeps the order"
        assert not torch.equal(tgt_in, labels), ("the decoder input must be the labels shifted right, starting with "
                                                 "<bos> = 1: position t sees the tokens before label t, not label t")
        assert (labels == EOS).sum(1).eq(1).all(), \
            f"each label row needs exactly one <eos> = 2 after the symbols, got\n{labels}"
        assert not (tgt_in == EOS).any(), "<eos> is never fed to the decoder: replace it by <pad> in the decoder input"
        at_row_end = torch.cat([src, torch.full((src.size(0), 1), EOS)], dim=1)
        if torch.equal(labels, at_row_end):
            raise AssertionError("<eos> must come right after each sentence's last symbol, not at the end of the "
                                 "padded row: labels[b, length_b] = 2, then <pad>")
        assert torch.equal(labels, expected_labels), f"labels should be\n{expected_labels}\ngot\n{labels}"
        assert torch.equal(tgt_in, expected_in), f"the decoder input should be\n{expected_in}\ngot\n{tgt_in}"
    run_checker("copy_batch", your_function, check)
