"""The checkers of notebook 07's exercises: plausible wrong answers -> AssertionError
with a message that says what is wrong, right answers (several ways of writing them) -> "correct".
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import pytest
import torch

from transformer_lib.exercises.encoder import check_padding_mask, check_pre_ln_encoder_layer


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



def right_padding_mask(lengths, max_len):
    return torch.arange(max_len)[None, :] >= lengths[:, None]


def padding_mask_loops(lengths, max_len):
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        mask[b, n:] = True
    return mask


def padding_mask_from_ones(lengths, max_len):
    real = torch.ones(len(lengths), max_len).cumsum(1) <= lengths[:, None]    # float cumsum, bool out
    return ~real


@pytest.mark.parametrize("right", [right_padding_mask, padding_mask_loops, padding_mask_from_ones])
def test_padding_mask_right(right):
    assert accepted(check_padding_mask, right)


def in_place_lengths(lengths, max_len):
    lengths.unsqueeze_(1)                                          # (B,) -> (B, 1), in the caller's tensor too
    return torch.arange(max_len)[None, :] >= lengths


@pytest.mark.parametrize("wrong, message", [
    (lambda lengths, max_len: torch.arange(max_len)[None, :] < lengths[:, None], "marks the real tokens"),
    (lambda lengths, max_len: (torch.arange(max_len)[None, :] >= lengths[:, None]).float(), "must be bool"),
    (lambda lengths, max_len: torch.arange(max_len)[None, :] > lengths[:, None], "off by one.*j >= n"),
    (lambda lengths, max_len: torch.arange(max_len)[None, :] >= lengths[:, None] - 1, "last real token"),
    (lambda lengths, max_len: right_padding_mask(lengths, max_len).T, r"\(max_len, B\)"),
    (lambda lengths, max_len: right_padding_mask(lengths, int(lengths.max())), "not lengths.max"),
    (lambda lengths, max_len: right_padding_mask(lengths, max_len).tolist(), "return a torch.Tensor"),
    (lambda lengths, max_len: torch.arange(max_len) >= lengths, "raised RuntimeError"),
    (in_place_lengths, "in place"),
])
def test_padding_mask_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_padding_mask(wrong)


def right_pre_ln(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    h = x + self_attn(*(norm1(x),) * 3, key_padding_mask=src_key_padding_mask)[0]
    return h + feed_forward(norm2(h))


def post_ln(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    h = norm1(x + self_attn(x, x, x, key_padding_mask=src_key_padding_mask)[0])
    return norm2(h + feed_forward(h))


def no_mask(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    return right_pre_ln(x, self_attn, feed_forward, norm1, norm2)


def normalised_output(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    return norm2(right_pre_ln(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask))


def pre_ln_keywords(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    y = norm1(x)
    x = x + self_attn(query=y, key=y, value=y, key_padding_mask=src_key_padding_mask, need_weights=False)[0]
    return x + feed_forward(norm2(x))


def pre_ln(x, self_attn, feed_forward, norm1, norm2, mask, swap=False, second_from_x=False, norm_residual=False,
           drop_ff=False, raw_attn=False):
    if swap:
        norm1, norm2 = norm2, norm1
    y = norm1(x)
    out = self_attn(y, y, y, key_padding_mask=mask)
    h = (y if norm_residual else x) + (out if raw_attn else out[0])
    if drop_ff:
        return h
    return (x if second_from_x else norm2(h) if norm_residual else h) + feed_forward(norm2(h))


@pytest.mark.parametrize("right", [right_pre_ln, pre_ln_keywords])
def test_pre_ln_right(right):
    assert accepted(check_pre_ln_encoder_layer, right)


@pytest.mark.parametrize("wrong, message", [
    (post_ln, "post-LN"), (no_mask, "padding mask is ignored"),
    (normalised_output, "LayerNorm was applied to the layer's output"),
    (lambda x, a, f, n1, n2, src_key_padding_mask=None: pre_ln(x, a, f, n1, n2, ~src_key_padding_mask), "inverted"),
    (lambda x, a, f, n1, n2, src_key_padding_mask=None: pre_ln(x, a, f, n1, n2, src_key_padding_mask, swap=True),
     "swapped"),
    (lambda x, a, f, n1, n2, src_key_padding_mask=None: pre_ln(x, a, f, n1, n2, src_key_padding_mask,
                                                                second_from_x=True), "second residual adds x"),
    (lambda x, a, f, n1, n2, src_key_padding_mask=None: pre_ln(x, a, f, n1, n2, src_key_padding_mask,
                                                                norm_residual=True), "add the input itself"),
    (lambda x, a, f, n1, n2, src_key_padding_mask=None: pre_ln(x, a, f, n1, n2, src_key_padding_mask,
                                                                drop_ff=True), "feed-forward block is missing"),
    (lambda x, a, f, n1, n2, src_key_padding_mask=None: pre_ln(x, a, f, n1, n2, src_key_padding_mask,
                                                                raw_attn=True), "take \\[0\\]"),
])
def test_pre_ln_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pre_ln_encoder_layer(wrong)


def pre_ln_norm1_twice(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    return right_pre_ln(x, self_attn, feed_forward, norm1, norm1, src_key_padding_mask)


def pre_ln_query_only(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    h = x + self_attn(norm1(x), x, x, key_padding_mask=src_key_padding_mask)[0]
    return h + feed_forward(norm2(h))


def pre_ln_mask_required(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    return right_pre_ln(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask.bool())


def pre_ln_library(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    from transformer_lib.encoder import EncoderLayer
    layer = EncoderLayer(x.size(-1), self_attn.n_heads, 2 * x.size(-1), dropout=0.0, norm_first=True).eval()
    layer.self_attn, layer.feed_forward = self_attn, feed_forward
    layer.sublayers[0].norm, layer.sublayers[1].norm = norm1, norm2
    return layer(x, src_key_padding_mask=src_key_padding_mask)


@pytest.mark.parametrize("wrong, message", [
    (pre_ln_norm1_twice, "norm1 was used twice"),
    (pre_ln_query_only, "only the query was normalised"),
    (lambda x, a, f, n1, n2, src_key_padding_mask=None: right_pre_ln(x, a, f, n2, n2, src_key_padding_mask),
     "norm2 was used twice"),
    (pre_ln_mask_required, "AttributeError.*no padding mask"),
    (pre_ln_library, "EncoderLayer is the course's own layer"),
])
def test_pre_ln_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pre_ln_encoder_layer(wrong)


def test_pre_ln_runs_with_autograd():
    def needs_grad(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
        assert torch.is_grad_enabled()
        return right_pre_ln(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask)

    assert accepted(check_pre_ln_encoder_layer, needs_grad)


@pytest.mark.parametrize("wrong, message", [
    (lambda lengths, max_len: torch.arange(max_len)[None, :] >= lengths.clamp(min=1)[:, None], "expected|1 of its 2 rows are wrong"),
    (lambda lengths, max_len: {(4, 1, 6, 3): torch.tensor([[0, 0, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1], [0] * 6, [0, 0, 0, 1, 1, 1]]),
                               (2, 3): torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]), (3,): torch.tensor([[0, 0, 0]]),
                               (0, 2): torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])}.get(
        tuple(lengths.tolist()), torch.zeros(1, 1)).bool(), "shape"),
])
def test_padding_mask_more_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_padding_mask(wrong)


def pre_ln_with_dropout(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    h = x + torch.nn.functional.dropout(self_attn(*(norm1(x),) * 3, key_padding_mask=src_key_padding_mask)[0], 0.1)
    return h + feed_forward(norm2(h))


@pytest.mark.parametrize("wrong, message", [
    (pre_ln_with_dropout, "two calls with the same input gave different outputs"),
    (lambda x, a, f, n1, n2, src_key_padding_mask=None: (lambda h: h + f(n2(x)))(
        x + a(*(n1(x),) * 3, key_padding_mask=src_key_padding_mask)[0]), "the feed-forward reads norm2\\(x\\)"),
])
def test_pre_ln_named_beyond_the_issue(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pre_ln_encoder_layer(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda lengths, max_len: torch.arange(max_len)[None, :] >= max_len - lengths[:, None], "LEFT padding"),
    (lambda lengths, max_len: torch.arange(max_len)[None, :] == lengths[:, None], ">=, not =="),
])
def test_padding_mask_named_beyond_the_issue(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_padding_mask(wrong)


# ---------------------------------------------------------------- fresh4: a sublayer that reads its input unnormalised
def ff_without_norm2(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    y = norm1(x)
    h = x + self_attn(y, y, y, key_padding_mask=src_key_padding_mask)[0]
    return h + feed_forward(h)


def attention_without_norm1(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    h = x + self_attn(x, x, x, key_padding_mask=src_key_padding_mask)[0]
    return h + feed_forward(norm2(h))


def padding_as_attn_mask(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask=None):
    y = norm1(x)
    h = x + self_attn(y, y, y, attn_mask=src_key_padding_mask)[0]
    return h + feed_forward(norm2(h))


@pytest.mark.parametrize("wrong, message", [
    (ff_without_norm2, "the feed-forward reads h itself, norm2 is missing"),
    (attention_without_norm1, "the self-attention reads x itself, norm1 is missing"),
    (padding_as_attn_mask, "pass it as key_padding_mask=...; attn_mask is the \\(S, S\\) mask"),
])
def test_pre_ln_missing_norms_and_the_mask_argument_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pre_ln_encoder_layer(wrong)
