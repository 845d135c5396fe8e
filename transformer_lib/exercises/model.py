"""Checkers for the exercises of notebook 09 (the full Transformer). Hand-written, not exported from a notebook."""
import functools

import torch
from torch import nn

from transformer_lib.exercises import Refuse, call, fresh_random, run_checker
from transformer_lib.exercises.explain import is_int, name_difference, name_slip, number_expected, what_it_is, where_wrong
from transformer_lib.model import EncoderDecoder, Transformer, build_transformer
from transformer_lib.exercises.guards import equal

_BY_FORMULA = "count_parameters must count by formula; building the model (even on the meta device) is what the " \
              "checker does to compare with you"
_NO_MODEL = [Refuse((Transformer, "__init__"), _BY_FORMULA), Refuse((EncoderDecoder, "__init__"), _BY_FORMULA),
             Refuse(build_transformer, _BY_FORMULA), Refuse((nn.Transformer, "__init__"), _BY_FORMULA)]

PAD, BOS, EOS = 0, 1, 2


@functools.lru_cache(maxsize=64)                  # the fixed cases are built once per session
def _real_count(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings, norm_first) -> int:
    with torch.device("meta"):                    # shapes only: no memory, no random numbers
        model = Transformer(src_vocab_size, tgt_vocab_size, d_model=d_model, n_heads=2, d_ff=d_ff,
                            n_encoder_layers=n_layers, n_decoder_layers=n_layers, norm_first=norm_first,
                            tie_embeddings=tie_embeddings)
    return sum(p.numel() for p in model.parameters())


def _formula(case: dict, ln_bias=True, ff_bias=True, attn_bias=True, projections=4, cross_attention=True,
             encoder_norms=2, decoder_norms=3, final_norms="pre-LN", tied=1, untied=3, generator_bias="none",
             positions=False, ff_width="d_ff", ff_blocks=1, decoder=True, tgt_rows="tgt", biases=True) -> int:
    """The course's parameter count with each step as a knob: the defaults give the right count, one knob
    turned gives one usual slip (`name_slip` tries them one and two at a time). `tgt_rows`: which untied target-side
    matrices have tgt_vocab_size rows ("tgt": both; "src": neither; "one src": one of the two, which a count cannot
    tell apart);
    `generator_bias`: "none", "always", or "untied" (an output layer with a bias only when it is its own matrix)."""
    D, N = case["d_model"], case["n_layers"]
    F = {"d_ff": case["d_ff"], "4D": 4 * D}[ff_width]
    V_src, V_tgt = case["src_vocab_size"], case["tgt_vocab_size"]
    norm = 2 * D if ln_bias else D
    attention = projections * D * D + (projections * D if attn_bias and biases else 0)
    ffn = ff_blocks * (2 * D * F + (F + D if ff_bias and biases else 0))
    encoder = N * (attention + ffn + encoder_norms * norm)
    decoder_layers = N * ((2 if cross_attention else 1) * attention + ffn
                          + (decoder_norms if cross_attention else decoder_norms - 1) * norm) if decoder else 0
    finals = {"pre-LN": 2 * norm if case["norm_first"] else 0, "never": 0, "always": 2 * norm}[final_norms]
    embedding_rows = V_src if tgt_rows in ("src", "one src") else V_tgt
    generator_rows = V_src if tgt_rows == "src" else V_tgt
    if case["tie_embeddings"]:
        embeddings = tied * V_src * D                                    # one V x D matrix, counted `tied` times
    else:                                                                # source, target, output layer (untied = 3)
        embeddings = V_src * D + embedding_rows * D + (generator_rows * D if untied == 3 else 0)
    bias = generator_bias == "always" or (generator_bias == "untied" and not case["tie_embeddings"])
    return (encoder + decoder_layers + finals + embeddings + (generator_rows if bias else 0)
            + (512 * D if positions else 0))


_COUNT_SLIPS = {  # each message, and the knobs of `_formula` that make its slip
    "the biases are missing: every attention projection and both feed-forward layers have one": dict(biases=False),
    "the attention biases are missing: each of the four D x D projections has a bias of D": dict(attn_bias=False),
    "the feed-forward biases are missing: each feed-forward block has d_ff + d_model of them, in every encoder "
    "and every decoder layer": dict(ff_bias=False),
    "a LayerNorm has a gain AND a bias, 2·d_model parameters; you counted d_model": dict(ln_bias=False),
    "the feed-forward width is d_ff, the argument; you used 4·d_model (the paper's ratio, not always the case)":
        dict(ff_width="4D"),
    "the cross-attention is missing: every decoder layer has a second attention (4 D x D projections with "
    "biases) and a third LayerNorm": dict(cross_attention=False),
    "an attention block has FOUR D x D projections (query, key, value and output), each with a bias":
        dict(projections=3),
    "an encoder layer has one feed-forward block and a decoder layer one, not two": dict(ff_blocks=2),
    "the LayerNorms are missing: 2D each, two per encoder layer, three per decoder layer":
        dict(encoder_norms=0, decoder_norms=0),
    "n_layers LayerNorms too many (one per layer of one stack): a layer has one LayerNorm per sublayer, two in "
    "an encoder layer, three in a decoder layer": dict(encoder_norms=3),
    "n_layers LayerNorms too few (one per layer of one stack): a layer has one LayerNorm per sublayer, two in "
    "an encoder layer, three in a decoder layer (self-attention, cross-attention, feed-forward)": dict(encoder_norms=1),
    "a LayerNorm too many in every layer: one per sublayer, two in an encoder layer, three in a decoder layer":
        dict(encoder_norms=3, decoder_norms=4),
    "a pre-LN stack ends with one more LayerNorm (gain and bias, 2D each), encoder and decoder":
        dict(final_norms="never"),
    "only a pre-LN stack (norm_first=True) ends with a LayerNorm; the post-LN one has none": dict(final_norms="always"),
    "with tied weights the target embedding and the output layer ARE the source embedding: count V·D once":
        dict(tied=2),
    "with tied weights the source and target embeddings and the output layer are ONE matrix: count V·D once, "
    "not three times": dict(tied=3),
    "untied, the output layer is a third V_tgt x D matrix (no bias)": dict(untied=2),
    "the untied target embedding and the output layer have tgt_vocab_size rows, not src_vocab_size":
        dict(tgt_rows="src"),
    "one of the untied target-side matrices, the target embedding or the output layer, has src_vocab_size rows in "
    "your count: both have tgt_vocab_size rows (one per TARGET word)": dict(tgt_rows="one src"),
    "the output layer has no bias (it is the embedding matrix, tied or not)": dict(generator_bias="always"),
    "untied, the output layer is its own V_tgt x D matrix, still without a bias (nn.Linear(d_model, "
    "tgt_vocab_size, bias=False)); you counted tgt_vocab_size more": dict(generator_bias="untied"),
    "the sinusoidal table (max_len x D) is a fixed buffer, not a parameter: it is not trained and not counted":
        dict(positions=True),
    "the decoder stack is missing: n_layers decoder layers (self-attention, cross-attention, feed-forward, three "
    "LayerNorms) besides the encoder's": dict(decoder=False),
}


def _count_cases() -> list[dict]:
    """Fixed sizes where no two slips give the same count (d_ff ≠ 4·d_model in most, vocabularies apart), then
    sizes drawn afresh."""
    cases = [dict(src_vocab_size=37000, tgt_vocab_size=37000, d_model=512, d_ff=2048, n_layers=6),
             dict(src_vocab_size=100, tgt_vocab_size=100, d_model=16, d_ff=48, n_layers=3),
             dict(src_vocab_size=100, tgt_vocab_size=100, d_model=16, d_ff=48, n_layers=3, norm_first=True),
             dict(src_vocab_size=120, tgt_vocab_size=90, d_model=16, d_ff=48, n_layers=2, tie_embeddings=False),
             dict(src_vocab_size=37000, tgt_vocab_size=37000, d_model=512, d_ff=2048, n_layers=6,
                  tie_embeddings=False, norm_first=True),
             dict(src_vocab_size=211, tgt_vocab_size=211, d_model=20, d_ff=70, n_layers=1, norm_first=True),
             dict(src_vocab_size=301, tgt_vocab_size=173, d_model=24, d_ff=37, n_layers=4, tie_embeddings=False)]
    rng = fresh_random()
    vocab, d_model = rng.randint(200, 5000), 2 * rng.randint(9, 40)    # sizes no fixed case has
    tie = rng.random() < 0.5
    cases.append(dict(src_vocab_size=vocab, tgt_vocab_size=vocab if tie else rng.randint(200, 5000),
                      d_model=d_model, d_ff=rng.randint(10, 100), n_layers=rng.randint(1, 5),
                      tie_embeddings=tie, norm_first=rng.random() < 0.5))
    return [dict(tie_embeddings=True, norm_first=False) | case for case in cases]


def check_count_parameters(your_function) -> None:
    """`count_parameters(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings, norm_first)`
    equals the number of parameters of the real model, for tied and untied, post-LN and pre-LN configs."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def check(count_parameters):
        cases = _count_cases()
        answers, expected, returned = [], [], None
        for full in cases:
            expected.append(_real_count(**full))
            got = call(count_parameters, **full, on=f"sizes {full}", refuse=_NO_MODEL)
            assert isinstance(got, int) or (isinstance(got, torch.Tensor) and got.numel() == 1), \
                f"return a whole number, got {what_it_is(got)}"
            answers.append(int(got))
            returned = got if not is_int(got) and returned is None else returned
        if answers == expected:
            if returned is not None:
                number_expected(returned, "count_parameters has the right counts", kind="int")
            return
        slip = name_slip(answers, cases, _formula, _COUNT_SLIPS, lambda got, wrong: got == wrong)
        i = next(i for i, (got, want) in enumerate(zip(answers, expected)) if got != want)
        full, got = cases[i], answers[i]
        where = where_wrong([a == e for a, e in zip(answers, expected)], cases, {
            "for pre-LN (norm_first=True)": lambda c: c["norm_first"], "for post-LN": lambda c: not c["norm_first"],
            "with tied embeddings": lambda c: c["tie_embeddings"], "with untied embeddings": lambda c: not c["tie_embeddings"],
            "when d_ff = 4·d_model": lambda c: c["d_ff"] == 4 * c["d_model"]})
        if not slip:
            offsets = {(a - e) / (2 * c["d_model"]) for a, e, c in zip(answers, expected, cases)}
            k = next(iter(offsets))
            if len(offsets) == 1 and k == int(k):             # the same number of LayerNorms off in every case
                slip = (f"that is {abs(int(k))} LayerNorm(s) (2·d_model each) too {'many' if k > 0 else 'few'} in "
                        "every case: an encoder layer has 2, a decoder layer 3, and only a pre-LN stack one more "
                        "at its end")
            elif all(a > e and (a - e) % c["d_model"] == 0 for a, e, c in zip(answers, expected, cases)):
                slip = ("your count has whole rows of d_model too many in every case: the sinusoidal positions are "
                        "a buffer (not trained, not counted), and with tied weights the embeddings are counted once")
        raise AssertionError(f"for {full} the model has {expected[i]:,} parameters, your formula gives {got:,} "
                             f"(off by {got - expected[i]:+,})" + (f": {slip}" if slip else "")
                             + (f"; your count is {where}" if where and not slip else ""))
    run_checker("count_parameters", your_function, check)


def _reference_copy_batch(src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = src.size(0)
    lengths = (src != PAD).sum(1)
    labels = torch.cat([src, torch.full((n, 1), PAD, dtype=src.dtype)], dim=1)  # (B, L + 1)
    labels[torch.arange(n), lengths] = EOS                                     # <eos> right after the symbols
    tgt_in = torch.cat([torch.full((n, 1), BOS, dtype=src.dtype), labels[:, :-1]], dim=1)  # shifted right
    return tgt_in.masked_fill(tgt_in == EOS, PAD), labels


def _copy_sources() -> list[torch.Tensor]:
    """The fixed batch (int64), then one drawn afresh in int32 (other sizes, lengths, symbols and dtype)."""
    fixed = torch.tensor([[5, 9, 3, 0, 0], [7, 4, 11, 12, 6], [8, 0, 0, 0, 0]])
    rng = fresh_random()
    B, L = rng.randint(4, 7), rng.randint(6, 10)                          # never the fixed batch's shape
    drawn = torch.zeros(B, L, dtype=torch.int32)                          # the statement: outputs of src's dtype
    for row in drawn:
        n = rng.randint(1, L)
        row[:n] = torch.tensor([rng.randint(3, 20) for _ in range(n)])
    return [fixed, drawn]


def _say_which_rows(src: torch.Tensor, got: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """When only some rows are wrong, say what those rows share (no padding, one symbol), and show the first."""
    wrong = (got != expected).any(dim=1)                                   # (B,)
    if not wrong.any() or wrong.all():
        return
    lengths = (src != PAD).sum(dim=1)
    said = where_wrong(wrong.logical_not().tolist(), list(range(len(src))), {
        "for the rows that fill all L columns (no <pad> in src)": lambda b: lengths[b] == src.size(1),
        "for the rows with a single symbol": lambda b: lengths[b] == 1})
    b = int(wrong.nonzero()[0])
    full = " A row without <pad> has no first <pad> to find (argmax of src == 0 is then 0): count the symbols, " \
           "(src != 0).sum(1)" if said and "fill all L" in said else ""
    raise AssertionError(f"the {name} rows are {said or 'wrong for rows ' + str(wrong.nonzero().flatten().tolist())}: "
                         f"for src row {src[b].tolist()} the {name} row should be {expected[b].tolist()}, got "
                         f"{got[b].tolist()}.{full}")


def _check_copy_on(copy_batch, src: torch.Tensor) -> None:
    B, L = src.shape
    expected_in, expected_labels = _reference_copy_batch(src)
    result = call(copy_batch, src, on=f"src of shape (B, L) = {(B, L)}, padded with 0")
    assert isinstance(result, tuple) and len(result) == 2, "return a pair (decoder input, labels)"
    tgt_in, labels = result
    for name, t in [("decoder input", tgt_in), ("labels", labels)]:
        assert isinstance(t, torch.Tensor) and t.shape == (B, L + 1), \
            f"the {name} must be a tensor of shape (B, L + 1) = {(B, L + 1)}, got {getattr(t, 'shape', t)}"
        assert t.dtype == src.dtype or t.dtype.is_floating_point or t.dtype == torch.bool, (
            f"the {name} have dtype {t.dtype} for a src of dtype {src.dtype}: both outputs keep src's dtype, as the "
            "statement asks; build them with dtype=src.dtype (torch.full, torch.zeros) rather than a fixed "
            f"{t.dtype}, and no .long() on src")
        assert t.dtype == src.dtype, (f"the {name} have dtype {t.dtype}; they are token ids, integers like src "
                                      f"({src.dtype}): an embedding and the loss need them so. Build them from "
                                      "src (torch.full(..., dtype=src.dtype), torch.cat) without a float on the way")
    if equal(tgt_in, expected_labels) and equal(labels, expected_in):
        raise AssertionError("the pair is swapped: return (decoder input, labels), the decoder input first "
                             "(it starts with <bos> = 1), then the labels (they end with <eos> = 2)")
    reversed_src = src.clone()
    for row, n in zip(reversed_src, (src != PAD).sum(1).tolist()):
        row[:n] = row[:n].flip(0)
    assert equal(labels, expected_labels) or not equal(labels[:, :L], src.flip(1)) and not equal(
        labels, _reference_copy_batch(reversed_src)[1]), "that is reversal; the copy task keeps the order"
    assert not equal(tgt_in, labels), ("the decoder input must be the labels shifted right, starting with "
                                             "<bos> = 1: position t sees the tokens before label t, not label t")
    assert (tgt_in[:, 0] == BOS).all(), f"every decoder input row starts with <bos> = 1, got first column {tgt_in[:, 0].tolist()}"
    if equal(labels[:, 1:], expected_labels[:, :-1]) and (labels[:, 0] == BOS).all():
        raise AssertionError("the labels start with <bos>; <bos> is only fed to the decoder. The labels are the "
                             "symbols themselves, then <eos> = 2: label t is what position t must predict")
    if (labels == -100).any() and equal(labels.masked_fill(labels == -100, PAD), expected_labels):
        raise AssertionError("the labels pad with -100; the course pads them with <pad> = 0 (the loss ignores pad_id)")
    if equal(labels[:, :-1], expected_labels[:, 1:]):
        raise AssertionError("your labels lost the first symbol: label t is symbol t (then <eos>); it is the "
                             "decoder input that is shifted right, behind <bos>")
    assert (labels == EOS).sum(1).eq(1).all(), \
        f"each label row needs exactly one <eos> = 2 after the symbols, got\n{labels}"
    assert not (tgt_in == EOS).any(), "<eos> is never fed to the decoder: replace it by <pad> in the decoder input"
    at_row_end = torch.cat([src, torch.full((B, 1), EOS, dtype=src.dtype)], dim=1)
    if equal(labels, at_row_end):
        raise AssertionError("<eos> must come right after each sentence's last symbol, not at the end of the "
                             "padded row: labels[b, length_b] = 2, then <pad>")
    _say_which_rows(src, labels, expected_labels, "label")
    _say_which_rows(src, tgt_in, expected_in, "decoder input")
    name_difference(labels, expected_labels, f"the labels for src {tuple(src.shape)}: ", "; label rows are the "
                    "symbols, then <eos> = 2, then <pad> = 0")
    name_difference(tgt_in, expected_in, f"the decoder input for "
                    f"src {tuple(src.shape)}: ", "; it is <bos> = 1, then the labels shifted right, without <eos>")
    assert equal(labels, expected_labels), f"labels should be\n{expected_labels}\ngot\n{labels}"
    assert equal(tgt_in, expected_in), f"the decoder input should be\n{expected_in}\ngot\n{tgt_in}"


def check_copy_batch(your_function) -> None:
    """`copy_batch(src)` -> (decoder input, labels) for the copy task, as `reversal_batch` builds them."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def check(copy_batch):
        for src in _copy_sources():
            _check_copy_on(copy_batch, src)
    run_checker("copy_batch", your_function, check)
