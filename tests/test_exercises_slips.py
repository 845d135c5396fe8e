"""Issue 30: every slip the issue lists gets its own message (a misdiagnosis is a failing test), no two catalogued
slips give the same output on a checker's fixed cases, every rule the statements state is exercised, the library
functions that do an exercise's job are refused, and the comparisons cannot be patched away by the learner's code.
(The slips' own tests per notebook stay in tests/test_exercises_<module>.py.)"""
import contextlib
import io
import itertools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import subsequent_mask
from transformer_lib.exercises import attention, decoder, decoding, distributed, encoder, evaluation, model, multihead
from transformer_lib.exercises import positional, schedule, training
from transformer_lib.exercises.explain import name_slip, shape_story, where_wrong
from transformer_lib.multihead import merge_heads, split_heads
from transformer_lib.training import noam_lr

ROOT = Path(__file__).resolve().parent.parent


def accepted(check, answer) -> bool:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1


# --- the misdiagnoses of the issue, each with its own message -------------------------------------------------

def count(src_vocab_size, tgt_vocab_size, d_model, d_ff, n_layers, tie_embeddings=True, norm_first=False, **knobs):
    case = dict(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, d_model=d_model, d_ff=d_ff,
                n_layers=n_layers, tie_embeddings=tie_embeddings, norm_first=norm_first)
    D, F_, N = d_model, d_ff, n_layers
    ln_bias, ff_bias, extra_norm = knobs.get("ln_bias", True), knobs.get("ff_bias", True), knobs.get("extra", 0)
    norm = 2 * D if ln_bias else D
    attention_ = 4 * D * D + 4 * D
    ffn = 2 * D * F_ + (F_ + D if ff_bias else 0)
    total = N * (attention_ + ffn + 2 * norm) + N * (2 * attention_ + ffn + 3 * norm) + extra_norm * 2 * D
    total += 2 * norm if norm_first else 0
    total += src_vocab_size * D if tie_embeddings else (src_vocab_size + 2 * tgt_vocab_size) * D
    assert knobs or total == model._real_count(**case)
    return total


@pytest.mark.parametrize("knobs, message", [
    (dict(ln_bias=False), "a LayerNorm has a gain AND a bias, 2·d_model parameters; you counted d_model"),
    (dict(ff_bias=False), "the feed-forward biases are missing"),
    (dict(extra=1), "that is 1 LayerNorm"),
])
def test_count_parameters_tells_layer_norm_bias_feed_forward_biases_and_an_extra_layer_norm_apart(knobs, message):
    with pytest.raises(AssertionError, match=message):
        model.check_count_parameters(lambda **k: count(**k, **knobs))


def test_count_parameters_names_two_slips_at_once():
    with pytest.raises(AssertionError, match="two slips at once: .*feed-forward biases.* and .*gain AND a bias"):
        model.check_count_parameters(lambda **k: count(**k, ff_bias=False, ln_bias=False))


def masked_softmax_times_inf(scores, mask):
    return (scores + mask.float() * float("-inf")).softmax(dim=-1)


def masked_softmax_log(scores, mask):
    log_p = scores.masked_fill(mask, float("-inf")).log_softmax(dim=-1)
    return log_p.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)


@pytest.mark.parametrize("wrong, message", [
    (masked_softmax_times_inf, r"0 · \(−inf\) = NaN"),
    (masked_softmax_log, "log-probabilities"),
])
def test_masked_softmax_nan_from_zero_times_inf_and_log_softmax_are_not_called_overflow(wrong, message):
    with pytest.raises(AssertionError, match=message) as caught:
        attention.check_masked_softmax(wrong)
    assert "overflow" not in str(caught.value)


def test_split_heads_squeeze_that_loses_batch_of_one_is_named():
    def squeezed(x, n_heads):
        B, L, D = x.shape
        return x.view(B, L, n_heads, D // n_heads).transpose(1, 2).squeeze()

    with pytest.raises(AssertionError, match="axis B of size 1 is gone.*squeeze") as caught:
        multihead.check_split_heads(squeezed)
    assert "MultiheadAttention" not in str(caught.value)


def test_ngram_precision_with_unordered_ngrams_is_not_told_about_clipping():
    def as_sets(hypothesis, reference, n):
        grams = lambda words: [frozenset(words[i:i + n]) for i in range(len(words) - n + 1)]  # noqa: E731
        reference_grams = grams(reference)
        matches = 0
        for gram in grams(hypothesis):
            if gram in reference_grams:
                reference_grams.remove(gram)
                matches += 1
        return matches, len(grams(hypothesis))

    with pytest.raises(AssertionError, match="lost their word order") as caught:
        evaluation.check_ngram_precision(as_sets)
    assert "Clip" not in str(caught.value)


# --- the natural slips the issue found unnamed -------------------------------------------------------------------

def attention_by_hand(x, layer, fill=float("-inf"), kv="kv", zero_after=False, divide_by="sqrt"):
    B, T, D = x.shape
    H = layer.n_heads
    q = split_heads(layer.q_proj(x), H)
    k = split_heads((layer.q_proj if kv == "q" else layer.k_proj)(x), H)
    v = split_heads((layer.q_proj if kv == "q" else layer.v_proj)(x), H)
    d_k = D // H
    scores = q @ k.transpose(-2, -1) / (math.sqrt(d_k) if divide_by == "sqrt" else d_k)
    mask = subsequent_mask(T)
    weights = scores.softmax(-1).masked_fill(mask, 0.0) if zero_after else scores.masked_fill(mask, fill).softmax(-1)
    return layer.out_proj(merge_heads(weights @ v))


@pytest.mark.parametrize("knobs, message", [
    (dict(fill=0.0), "filled with 0, and exp\\(0\\) = 1"),
    (dict(kv="q"), "keys and values both came from layer.q_proj"),
    (dict(zero_after=True), "zeroed the masked weights AFTER the softmax"),
    (dict(divide_by="d_k"), "divided by d_k; eq. 1 divides by its square root"),
])
def test_causal_self_attention_names_the_four_natural_slips(knobs, message):
    with pytest.raises(AssertionError, match=message):
        multihead.check_causal_self_attention(lambda x, layer: attention_by_hand(x, layer, **knobs))


def test_causal_self_attention_names_two_slips_at_once():
    with pytest.raises(AssertionError, match="two slips at once: .*filled with 0.*divided by d_k"):
        multihead.check_causal_self_attention(lambda x, layer: attention_by_hand(x, layer, fill=0.0, divide_by="d_k"))


def test_rms_norm_with_the_mean_of_absolute_values_is_named():
    from transformer_lib.exercises.sublayers import check_rms_norm
    with pytest.raises(AssertionError, match=r"mean of \|x\|"):
        check_rms_norm(lambda x, weight, eps=1e-6: weight * x / (x.abs().mean(-1, keepdim=True) + eps))


def test_label_smoothing_without_one_minus_eps_is_named():
    def loss(logits, target, eps, pad_id):
        real = target != pad_id
        q = F.one_hot(target.masked_fill(~real, 0), logits.size(-1)).double() + eps / logits.size(-1)
        return -(q * logits.double().log_softmax(-1)).sum(-1)[real].mean()

    with pytest.raises(AssertionError, match="true token's weight is 1 − ε, not 1"):
        training.check_label_smoothing(loss)


def test_gradient_accumulation_without_the_division_is_named():
    def accumulate(model_, criterion, micro_batches, pad_id):
        for x, target in micro_batches:
            (criterion(model_(x), target) * int((target != pad_id).sum())).backward()

    with pytest.raises(AssertionError, match="did not divide by the total count"):
        training.check_gradient_accumulation(accumulate)


def test_noam_lr_power_precedence_is_named():
    with pytest.raises(AssertionError, match=r"warmup_steps \*\* -3/2 is \(warmup_steps \*\* -3\) / 2"):
        training.check_noam_lr(lambda step, d, w: d ** -0.5 * min(step ** -0.5, step * w ** -3 / 2))


def test_brevity_penalty_as_a_length_ratio_is_named():
    with pytest.raises(AssertionError, match="not the length ratio c / r"):
        evaluation.check_brevity_penalty(lambda c, r: 1.0 if c >= r else c / r)


def test_padding_mask_with_an_extra_axis_is_named():
    def padding_mask(lengths, max_len):
        return (torch.arange(max_len)[None, :] >= lengths[:, None])[:, None, :]      # (B, 1, S)

    with pytest.raises(AssertionError, match="extra axis of size 1 at position 1.*key_padding_mask is \\(B, S\\)"):
        encoder.check_padding_mask(padding_mask)


def test_encoder_layer_without_its_feed_forward_residual_is_named():
    def layer(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
        y = norm1(x)
        h = x + self_attn(y, y, y, key_padding_mask=src_key_padding_mask)[0]
        return feed_forward(norm2(h))

    with pytest.raises(AssertionError, match="feed-forward block has no residual"):
        encoder.check_pre_ln_encoder_layer(layer)


# --- no two catalogued slips give the same output on a checker's fixed cases ------------------------------------

def distinct(outputs: dict, same) -> list[tuple[str, str]]:
    return [(a[:60], b[:60]) for a, b in itertools.combinations(outputs, 2) if same(outputs[a], outputs[b])]


def test_count_parameters_slips_differ_on_the_fixed_cases():
    fixed = model._count_cases()[:-1]
    outputs = {m: [model._formula(c, **k) for c in fixed] for m, k in model._COUNT_SLIPS.items()}
    assert not distinct(outputs, lambda a, b: a == b)
    assert all(outputs[m] != [model._formula(c) for c in fixed] for m in outputs)


def test_causal_self_attention_slips_differ_on_the_fixed_case():
    layer = multihead.MultiHeadAttention(24, 4).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
        x = torch.randn(2, 5, 24, generator=generator)
        outputs = {m: multihead._by_hand((layer, x), **k) for m, k in multihead._ATTENTION_SLIPS.items()}
    assert not distinct(outputs, lambda a, b: bool(torch.allclose(a, b, atol=1e-5, rtol=1e-4, equal_nan=True)))


def test_noam_and_brevity_penalty_slips_differ_on_the_fixed_cases():
    steps = [(d, w, s) for d, w in ((512, 4000), (128, 200)) for s in (1, 2, 10, w // 2, w - 1, w, w + 1, 4 * w, 10 * w)]
    noam = {m: [schedule._noam_slips(s, d, w)[m] for d, w, s in steps] for m in schedule._noam_slips(1, 1, 1)}
    assert not distinct(noam, lambda a, b: all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b)))
    pairs = [(10, 10), (11, 10), (12, 10), (9, 10), (5, 10), (1, 7), (3, 30), (7, 20)]
    bp = {m: [f(c, r) for c, r in pairs] for m, f in evaluation._BP_SLIPS.items()}
    assert not distinct(bp, lambda a, b: all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b)))


def test_loop_table_slips_differ_on_the_fixed_cases():
    outputs = {m: torch.cat([positional._table(n, d, **k).flatten() for n, d in ((30, 16), (6, 4))])
               for m, k in positional._SLIPS.items()}
    assert not distinct(outputs, lambda a, b: bool(torch.allclose(a, b, atol=1e-6)))


def test_label_smoothing_slips_differ_on_the_fixed_cases():
    cases = training._smoothing_cases()[:-1]
    messages = training._smoothed_variants(cases[1][0].double(), cases[1][1], 0.1, 0).keys()
    outputs = {m: [float(training._smoothed_variants(lg.double(), tg, e, pd)[m]) for lg, tg, e, pd, _ in cases
                   if m in training._smoothed_variants(lg.double(), tg, e, pd)] for m in messages}
    assert not distinct(outputs, lambda a, b: all(math.isclose(x, y, rel_tol=1e-5) for x, y in zip(a, b)))


# --- the shared helpers say where a wrong answer differs --------------------------------------------------------

def test_name_slip_where_wrong_and_shape_story():
    cases = [1, 2, 3]
    variant = lambda case, double=False, plus=0: case * (2 if double else 1) + plus   # noqa: E731
    slips = {"doubled": dict(double=True), "one more": dict(plus=1)}
    assert name_slip([2, 4, 6], cases, variant, slips, lambda a, b: a == b) == "doubled"
    assert name_slip([3, 5, 7], cases, variant, slips, lambda a, b: a == b).startswith("two slips at once: doubled")
    assert name_slip([5, 5, 5], cases, variant, slips, lambda a, b: a == b) is None
    assert where_wrong([True, False, True], cases, {"for even sizes": lambda c: c % 2 == 0}) == \
        "wrong only for even sizes, right in every other case"
    assert "axis B of size 1 is gone" in shape_story((2, 5, 3), (1, 2, 5, 3), ("B", "H", "L", "d_k"))
    assert "extra axis of size 1 at position 1" in shape_story((4, 1, 6), (4, 6), ("B", "S"))
    assert "order (L, B, D)" in shape_story((5, 2, 8), (2, 5, 8), ("B", "L", "D"))


# --- every rule the statements state is exercised ---------------------------------------------------------------

def test_is_causal_that_checks_batch_row_zero_only_is_refused():
    def is_causal(decoder_, tgt, memory):
        out = decoder_(tgt, memory)
        for j in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[:, j] += 1.0
            if not torch.allclose(decoder_(changed, memory)[0, :j], out[0, :j], atol=1e-6):   # row 0 only
                return False
        return True

    with pytest.raises(AssertionError, match="SECOND sentence of the batch"):
        decoder.check_is_causal(is_causal)


def test_greedy_decode_flat_list_for_a_batch_of_one_is_refused():
    from tests.test_exercises_decoding import reference_greedy

    def flat(model_, src, mask, bos_id, eos_id, max_len):
        out = reference_greedy(model_, src, mask, bos_id, eos_id, max_len)
        return out[0] if len(out) == 1 else out

    with pytest.raises(AssertionError, match="batch of ONE sentence you returned a flat list"):
        decoding.check_greedy_decode(flat)


def test_lower_casing_is_refused_where_case_matters():
    from transformer_lib.exercises.tokenization import check_word_tokenizer

    class Lower:
        def __init__(self, texts):
            self.words = ["<unk>"] + sorted({w.lower() for t in texts for w in t.split()})

        def encode(self, text):
            return [self.words.index(w.lower()) if w.lower() in self.words else 0 for w in text.split()]

        def decode(self, ids):
            return " ".join(self.words[i] for i in ids)

    with pytest.raises(AssertionError, match="lower-cased"):
        check_word_tokenizer(Lower)

    def ngrams_lower(hypothesis, reference, n):
        from collections import Counter
        grams = lambda w: Counter(tuple(x.lower() for x in w[i:i + n]) for i in range(len(w) - n + 1))  # noqa: E731
        h, r = grams(hypothesis), grams(reference)
        return sum(min(c, r[g]) for g, c in h.items()), max(len(hypothesis) - n + 1, 0)

    with pytest.raises(AssertionError, match="lower-cased"):
        evaluation.check_ngram_precision(ngrams_lower)


def test_copy_batch_with_float_labels_is_refused():
    from tests.test_exercises_model import right_copy_batch
    with pytest.raises(AssertionError, match="dtype torch.float32; they are token ids"):
        model.check_copy_batch(lambda src: tuple(t.float() for t in right_copy_batch(src)))


def test_label_smoothing_is_tried_with_a_negative_pad_id():
    def one_hot_of_padding(logits, target, eps, pad_id):
        q = (1 - eps) * F.one_hot(target, logits.size(-1)).double() + eps / logits.size(-1)
        return -(q * logits.double().log_softmax(-1)).sum(-1)[target != pad_id].mean()

    with pytest.raises(AssertionError, match="pad_id=-100 is not a class"):
        training.check_label_smoothing(one_hot_of_padding)


def test_every_checker_leaves_the_inputs_alone():
    """No checker switches the in-place check off: every learner call goes through `call` with keep_inputs on."""
    for path in (ROOT / "transformer_lib" / "exercises").glob("*.py"):
        assert "keep_inputs=False" not in path.read_text(encoding="utf-8"), path.name


# --- library shortcuts are refused -----------------------------------------------------------------------------

def test_tokenizers_metaspace_decoder_is_refused_for_join_pieces():
    from tokenizers import decoders
    from transformer_lib.exercises.tokenization import check_join_pieces
    with pytest.raises(AssertionError, match="Metaspace decoder by hand"):
        check_join_pieces(lambda tokens: decoders.Metaspace(replacement="▁", prepend_scheme="always").decode(tokens))


def test_sacrebleus_static_compute_bleu_is_refused_for_brevity_penalty():
    from sacrebleu.metrics.bleu import BLEU

    def brevity_penalty(c, r):
        return BLEU.compute_bleu([0] * 4, [1] * 4, c, r).bp / 100 if c else 0.0

    with pytest.raises(AssertionError, match="compute it yourself"):
        evaluation.check_brevity_penalty(brevity_penalty)


def test_a_c_function_can_be_refused():
    from transformer_lib.exercises import Refuse, call
    with pytest.raises(AssertionError, match="^no sqrt$"):
        call(lambda: math.sqrt(4.0), on="x", refuse=[Refuse(math.sqrt, "no sqrt")])
    assert call(lambda: math.sqrt(4.0), on="x") == 2.0                       # the hook is gone afterwards


# --- the comparisons are bound at import, so patching torch's cannot pass a wrong answer --------------------------

COMPARISONS = ("torch.allclose(", "torch.equal(", "torch.testing.assert_close(", "math.isclose(", "torch.isclose(")


def test_no_checker_looks_a_comparison_up_at_call_time():
    for path in (ROOT / "transformer_lib" / "exercises").glob("*.py"):
        if path.name == "guards.py":
            continue
        code = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines()
                         if not line.lstrip().startswith(("#", '"')))
        assert not [c for c in COMPARISONS if c in code.replace('"', "\n")], path.name


@pytest.mark.parametrize("check, wrong", [
    (attention.check_masked_softmax, lambda scores, mask: scores.softmax(-1)),
    (positional.check_loop_table, lambda m, d: torch.zeros(m, d, dtype=torch.float64)),
    (training.check_noam_lr, lambda step, d, w: 1.0),
    (distributed.check_shard, lambda batches, rank, world_size: batches[rank::world_size]),
])
def test_a_wrong_answer_that_patches_the_comparisons_is_still_refused(check, wrong, monkeypatch):
    def cheat(*args, **kwargs):
        monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)
        monkeypatch.setattr(torch, "equal", lambda *a, **k: True)
        monkeypatch.setattr(torch.testing, "assert_close", lambda *a, **k: None)
        monkeypatch.setattr(math, "isclose", lambda *a, **k: True)
        return wrong(*args, **kwargs)

    with pytest.raises(AssertionError):
        check(cheat)


# --- misdiagnoses found on held-out answers, each with its own message -------------------------------------------

def test_is_causal_with_a_loose_tolerance_is_told_so():
    def is_causal(decoder_, tgt, memory):
        out = decoder_(tgt, memory)
        for j in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[:, j] += 1.0
            if not torch.allclose(decoder_(changed, memory)[:, :j], out[:, :j], atol=0.1):
                return False
        return True

    with pytest.raises(AssertionError, match="your comparison is too loose"):
        decoder.check_is_causal(is_causal)


def test_noam_without_warmup_is_not_told_about_an_exponent_only():
    with pytest.raises(AssertionError, match="decay branch .* at every step: the warmup branch .* is missing"):
        training.check_noam_lr(lambda step, d, w: (d * step) ** -0.5)


def test_ngram_matches_counted_in_the_reference_are_named():
    from collections import Counter

    def reference_counts(hypothesis, reference, n):
        grams = lambda w: Counter(tuple(w[i:i + n]) for i in range(len(w) - n + 1))  # noqa: E731
        h, r = grams(hypothesis), grams(reference)
        return sum(r[g] for g in h), sum(h.values())

    with pytest.raises(AssertionError, match="occurs in the REFERENCE; a match count is min"):
        evaluation.check_ngram_precision(reference_counts)


# --- the second held-out set (fresh2): its accepted, unnamed and misdiagnosed slips, in instances of our own ------

def test_word_tokenizer_that_splits_on_one_space_is_named():
    from transformer_lib.exercises.tokenization import check_word_tokenizer

    class OneSpace:
        def __init__(self, texts):
            self.vocab = {w: i for i, w in enumerate(sorted({w for t in texts for w in t.split(" ")}), start=1)}
            self.words = {i: w for w, i in self.vocab.items()}

        def encode(self, text):
            return [self.vocab.get(w, 0) for w in text.split(" ")]

        def decode(self, ids):
            return " ".join(self.words.get(i, "<unk>") for i in ids)

    with pytest.raises(AssertionError, match=r"you split on ' ' \(split\(' '\)\).*text.split\(\) with no argument"):
        check_word_tokenizer(OneSpace)


@pytest.mark.parametrize("strip, text", [(str.strip, r"\['▁', '▁la'\]\) gave 'la', expected ' la'"),
                                         (str.lstrip, r"\['▁', '▁la'\]\) gave 'la', expected ' la'"),
                                         (str.rstrip, r"\['▁la', '▁'\]\) gave 'la', expected 'la '")])
def test_join_pieces_that_strips_a_lone_marker_is_named(strip, text):
    from transformer_lib.exercises.tokenization import check_join_pieces

    def join(tokens):
        out = "".join(tokens).replace("▁", " ")
        if strip is str.rstrip:
            return strip(out)[1:] if tokens and tokens[0].startswith("▁") else strip(out)
        return strip(out)

    with pytest.raises(AssertionError, match=text + ".*a lone ▁ is a space too"):
        check_join_pieces(join)


def test_split_heads_squeeze_that_loses_a_length_of_one_is_named_on_every_call():
    def squeeze_first(x, n_heads):
        B = x.size(0)
        y = x.squeeze()                                   # (B, D) when L = 1: the length is gone
        L, D = y.shape[-2], y.shape[-1]
        return y.reshape(B, L, n_heads, D // n_heads).transpose(1, 2)

    for _ in range(2):                                    # a fixed case, not a draw: the same message each time
        with pytest.raises(AssertionError, match=r"x of shape \(B=3, L=1, D=9\).*this case has L = 1.*squeeze\(\)"):
            multihead.check_split_heads(squeeze_first)


def test_split_heads_permute_then_reshape_is_named_by_its_order():
    def permuted(x, n_heads):
        B, L, D = x.shape
        return x.reshape(B, L, n_heads, D // n_heads).permute(0, 2, 3, 1).reshape(B, n_heads, L, D // n_heads)

    with pytest.raises(AssertionError, match=r"in the order \(B, H, d_k, L\), then reshaped"):
        multihead.check_split_heads(permuted)


def test_causal_self_attention_with_the_diagonal_masked_and_a_finite_fill_is_named():
    def diagonal_too(x, layer):
        B, T, D = x.shape
        H = layer.n_heads
        q, k, v = (split_heads(p(x), H) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
        blocked = torch.arange(T)[None, :] >= torch.arange(T)[:, None]           # j >= i: the diagonal too
        scores = (q @ k.transpose(-2, -1) / math.sqrt(D // H)).masked_fill(blocked, -1e4)
        return layer.out_proj(merge_heads(scores.softmax(-1) @ v))

    with pytest.raises(AssertionError, match=r"the diagonal is blocked too \(j >= i.*finite fill"):
        multihead.check_causal_self_attention(diagonal_too)


def test_is_causal_with_a_tensor_answer_is_told_to_return_a_python_bool():
    from tests.test_exercises_decoder import right_is_causal
    with pytest.raises(AssertionError, match=r"a Python bool, got a tensor of shape \(\).*bool\(\.\.\.\) or \.item\(\)"):
        decoder.check_is_causal(lambda d, t, m: torch.tensor([right_is_causal(d, t, m)]).all())


@pytest.mark.parametrize("check, answer, message", [
    (training.check_noam_lr, lambda step, d, w: d ** -0.5 * torch.tensor(min(step ** -0.5, step * w ** -1.5),
                                                                      dtype=torch.float64),
     r"noam_rate has the right values: return a number .* a tensor of shape \(\)"),
    (training.check_cooldown, lambda step, progress, d, w, c: torch.tensor(
        noam_lr(step, d, w) * min(1.0, (1 - progress) / c)), r"return a number .* a tensor of shape \(\)"),
    (decoding.check_length_normalised_score, lambda lp, n, a: lp / ((5 + n) / 6) ** a if torch.is_tensor(lp)
     else torch.tensor(lp) / ((5 + n) / 6) ** a, r"right value: return a number .* a tensor of shape \(\)"),
    (model.check_count_parameters, lambda *a, **k: float(_real_count_of(*a, **k)),
     r"return a whole number, got a float \(\d+\.0\)"),
])
def test_a_number_of_the_wrong_type_is_named(check, answer, message):
    with pytest.raises(AssertionError, match=message):
        check(answer)


def _real_count_of(*args, **kwargs):
    return model._real_count(**dict(zip(("src_vocab_size", "tgt_vocab_size", "d_model", "d_ff", "n_layers",
                                         "tie_embeddings", "norm_first"), args)) | kwargs)


def test_ngram_precision_as_floats_is_told_to_return_ints():
    from collections import Counter

    def as_floats(hypothesis, reference, n):
        h = Counter(zip(*(hypothesis[i:] for i in range(n))))
        r = Counter(zip(*(reference[i:] for i in range(n))))
        return float(sum(min(c, r[g]) for g, c in h.items())), float(sum(h.values()))

    with pytest.raises(AssertionError, match=r"must be two ints: return an int.*a float \(\d\.0\): count with ints"):
        evaluation.check_ngram_precision(as_floats)


def test_shard_that_returns_an_iterator_is_told_to_return_a_list():
    def lazy(batches, rank, world_size):
        return (b for i, b in enumerate(batches[:len(batches) - len(batches) % world_size]) if i % world_size == rank)

    with pytest.raises(AssertionError, match=r"return a list, as the statement asks; you returned a generator, an "
                                             r"iterator that is empty once read"):
        distributed.check_shard(lazy)


def test_real_token_batches_without_the_last_batch_names_the_missing_examples():
    from transformer_lib.exercises.data import check_real_token_batches

    def no_flush(lengths, max_tokens):
        out, batch, src, tgt = [], [], 0, 0
        for i, (s, t) in enumerate(lengths):
            if batch and max(src + s, tgt + t) > max_tokens:
                out.append(batch)
                batch, src, tgt = [], 0, 0
            batch, src, tgt = batch + [i], src + s, tgt + t
        return out

    with pytest.raises(AssertionError, match=r"expected \[\[0, 1, 2\].* in no batch\. The examples missing are those of "
                                             r"the last batch, \[.*\]: after the loop, append the batch still open"):
        check_real_token_batches(no_flush)


def test_attention_by_loops_with_the_values_read_one_index_off_is_named():
    def shifted(query, key, value):
        rows = []
        for q in query:
            scores = torch.stack([q @ k for k in key]) / math.sqrt(query.size(1))
            w = (scores - scores.max()).exp()
            w = w / w.sum()
            rows.append(sum(w[j] * value[j - 1] for j in range(len(key))))
        return torch.stack(rows)

    with pytest.raises(AssertionError, match=r"the values are read one index off.*value\[j - 1\]"):
        attention.check_attention_by_loops(shifted)


def test_rms_norm_with_the_square_of_the_mean_is_named():
    from transformer_lib.exercises.sublayers import check_rms_norm
    with pytest.raises(AssertionError, match=r"by sqrt\(mean\(x\)² \+ eps\).*You squared the mean"):
        check_rms_norm(lambda x, weight, eps=1e-6: weight * x / (x.mean(-1, keepdim=True).square() + eps).sqrt())


def test_copy_batch_that_finds_the_length_by_the_first_pad_is_told_about_full_rows():
    from tests.test_exercises_model import right_copy_batch

    def first_pad(src):
        tgt_in, labels = right_copy_batch(src)
        full = (src != 0).all(dim=1)                     # argmax of an all-False row is 0: <eos> lands at 0
        labels, tgt_in = labels.clone(), tgt_in.clone()
        labels[full] = torch.cat([torch.full((int(full.sum()), 1), 2), src[full]], dim=1)
        tgt_in[full] = torch.cat([torch.full((int(full.sum()), 1), 1), labels[full][:, :-1]], dim=1).masked_fill(
            torch.cat([torch.full((int(full.sum()), 1), 1), labels[full][:, :-1]], dim=1) == 2, 0)
        return tgt_in, labels

    with pytest.raises(AssertionError, match=r"wrong only for the rows that fill all L columns.*\(src != 0\)\.sum\(1\)"):
        model.check_copy_batch(first_pad)


def test_label_smoothing_without_the_minus_sign_is_named():
    def positive_log(logits, target, eps, pad_id):
        keep = target != pad_id
        logp = logits[keep].log_softmax(-1)
        q = (1 - eps) * F.one_hot(target[keep], logits.size(-1)).to(logp.dtype) + eps / logits.size(-1)
        return (q * logp).sum(-1).mean()

    with pytest.raises(AssertionError, match=r"the NEGATIVE of .*keep the minus sign"):
        training.check_label_smoothing(positive_log)


# --- a second held-out measurement (fresh3): causes named only where the answer's outputs match them -----------

@pytest.mark.parametrize("answer, message", [
    (lambda lp, n, a: lp * 6 / (a * (5 + n)), "You multiplied by α; lp\\(Y\\) RAISES"),   # α = 0: 0 in the divisor
    (lambda lp, n, a: lp / ((4 + n) / 6) ** a, "GNMT adds 5 to the length, you added 4"),
    (lambda lp, n, a: lp / ((5 + n) / 5) ** a, "GNMT divides 5 \\+ \\|Y\\| by 6, you divided by 5"),
])
def test_length_normalised_score_slips_are_derived_not_guessed(answer, message):
    with pytest.raises(AssertionError, match=message) as caught:
        decoding.check_length_normalised_score(answer)
    assert "handle it first" not in str(caught.value)


def test_length_normalised_score_that_converts_a_tensor_is_not_told_about_math_pow():
    with pytest.raises(AssertionError, match="turned into one Python number") as caught:
        decoding.check_length_normalised_score(lambda lp, n, a: torch.as_tensor(lp / ((5 + n) / 6) ** a).item())
    assert "math.pow" not in str(caught.value)
    with pytest.raises(AssertionError, match="math.(exp|log) works on numbers only"):
        decoding.check_length_normalised_score(lambda lp, n, a: lp * math.exp(-a * math.log((5 + n) / 6)))


def _ring_with(gather_into=0, gather_from=1, scatter_add=True):
    def ring(tensor, rank, world_size, send, recv):
        n, parts = world_size, list(tensor.clone().tensor_split(world_size))
        for s in range(n - 1):
            send(parts[(rank - s) % n])
            c = (rank - 1 - s) % n
            parts[c] = parts[c] + recv() if scatter_add else recv()
        for s in range(n - 1):
            send(parts[(rank + gather_from - s) % n])
            parts[(rank + gather_into - s) % n] = recv()
        return torch.cat(parts)
    return ring


@pytest.mark.parametrize("answer, message", [
    (_ring_with(gather_into=-1), "in the all-gather, rank r writes what it receives into chunk \\(r − 1 − s\\)"),
    (_ring_with(gather_from=2), "in the all-gather, rank r sends chunk \\(r \\+ 2 − s\\)"),
    (_ring_with(scatter_add=False), "in the reduce-scatter the receiver ADDS"),
])
def test_ring_allreduce_names_the_phase_its_outputs_match(answer, message):
    with pytest.raises(AssertionError, match=message):
        distributed.check_ring_allreduce(answer)


def test_ring_allreduce_with_an_unlisted_slip_says_where_it_goes_wrong():
    def ring(tensor, rank, world_size, send, recv):            # rank 0 drops what it receives in the last step
        n, parts = world_size, list(tensor.clone().tensor_split(world_size))
        for s in range(n - 1):
            send(parts[(rank - s) % n])
            parts[(rank - 1 - s) % n] = parts[(rank - 1 - s) % n] + recv()
        for s in range(n - 1):
            send(parts[(rank + 1 - s) % n])
            received = recv()
            if rank or s < n - 2:
                parts[(rank - s) % n] = received
        return torch.cat(parts)
    with pytest.raises(AssertionError, match="every message the ranks sent is right, but the chunks are put together "
                                             "wrongly") as caught:
        distributed.check_ring_allreduce(ring)
    assert "In reduce-scatter step s" not in str(caught.value)


def test_copy_batch_with_a_fixed_dtype_is_refused():
    def copy_batch(src):
        B, L = src.shape
        n = (src != 0).sum(1)
        labels = torch.zeros(B, L + 1, dtype=torch.int64)
        labels[:, :L] = src
        labels[torch.arange(B), n] = 2
        dec_in = torch.zeros(B, L + 1, dtype=torch.int64)
        dec_in[:, 0], dec_in[:, 1:] = 1, labels[:, :L]
        return dec_in.masked_fill(dec_in == 2, 0), labels
    with pytest.raises(AssertionError, match="keep src's dtype"):
        model.check_copy_batch(copy_batch)


def test_ngram_precision_keyed_by_words_glued_together_is_named():
    from collections import Counter

    def ngram_precision(hypothesis, reference, n):
        def grams(words):
            return Counter(sum((list(w) for w in words[i:i + n]), []).__str__() for i in range(len(words) - n + 1))
        h, r = grams(hypothesis), grams(reference)
        return sum(min(k, r[g]) for g, k in h.items()), sum(h.values())
    with pytest.raises(AssertionError, match="without a separator"):
        evaluation.check_ngram_precision(ngram_precision)


def test_scaled_embedding_with_a_trainable_gain_is_refused():
    from transformer_lib.exercises.embeddings import check_scaled_embedding

    class ScaledEmbedding(torch.nn.Module):
        def __init__(self, vocab_size, d_model):
            super().__init__()
            self.lut, self.d_model = torch.nn.Embedding(vocab_size, d_model), d_model
            torch.nn.init.normal_(self.lut.weight, std=d_model ** -0.5)
            self.gain = torch.nn.Parameter(torch.ones(1))          # 1 now, moved by the optimizer later
        def forward(self, tokens):
            return self.lut(tokens) * math.sqrt(self.d_model) * self.gain
    with pytest.raises(AssertionError, match="trains more than the table: gain \\(1,\\)"):
        check_scaled_embedding(ScaledEmbedding)


def test_masked_softmax_that_computes_in_float32_is_refused():
    with pytest.raises(AssertionError, match="the right values, but in torch.float32"):
        attention.check_masked_softmax(lambda scores, mask: torch.nan_to_num(
            torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1, dtype=torch.float32)))


def test_brevity_penalty_as_a_numpy_float32_is_refused_and_float64_accepted():
    import numpy as np

    def bp(c, r, kind):
        return kind(0.0 if c == 0 else 1.0 if c >= r else math.exp(1 - r / c))
    with pytest.raises(AssertionError, match="numpy.float32 .* keeps only 7 significant digits"):
        evaluation.check_brevity_penalty(lambda c, r: bp(c, r, np.float32))
    assert accepted(evaluation.check_brevity_penalty, lambda c, r: bp(c, r, np.float64))


def test_causal_mask_by_tril_is_refused():
    with pytest.raises(AssertionError, match="without torch.triu or torch.tril"):
        decoder.check_causal_mask(lambda T: torch.tril(torch.ones(T, T)) == 0)


@pytest.mark.parametrize("answer, message", [
    (lambda s, p, d, w, c: noam_lr(s, d, w) * (0.05 + 0.95 * min(1.0, (1 - p) / c)), "your ramp ends at 0.05"),
    (lambda s, p, d, w, c: noam_lr(s, d, w) * min(1.0, max(0.0, (c - p) / c)), "falls during the FIRST"),
    (lambda s, p, d, w, c: noam_lr(s, warmup_steps=d, d_model=w) * min(1.0, (1 - p) / c),
     "your eq. 3 is noam_lr\\(step, warmup_steps, d_model\\)"),
    (lambda s, p, d, w, c: noam_lr(s, d, w) * min(1.0, (1 - p) / c) ** 1.5, "to the power 1.5"),
])
def test_cooldown_slips_are_derived_from_the_reference(answer, message):
    with pytest.raises(AssertionError, match=message):
        training.check_cooldown(answer)


def test_target_mask_with_the_causal_part_transposed_is_named():
    from transformer_lib.exercises.data import check_target_mask

    def target_mask(tgt_in, pad_id):
        T = tgt_in.size(1)
        return torch.ones(T, T, dtype=torch.bool).tril(-1)[None] | (tgt_in == pad_id)[:, None, :]
    with pytest.raises(AssertionError, match="the causal part is transposed"):
        check_target_mask(target_mask)
