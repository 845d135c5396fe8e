"""Checkers for the exercises of notebook 07 (the encoder). Hand-written, not exported from a notebook."""
import torch

from transformer_lib.encoder import Encoder, EncoderLayer
from transformer_lib.exercises import Refuse, call, fresh_generator, run_checker
from transformer_lib.exercises.explain import name_difference, name_slip, shape_story
from transformer_lib.sublayers import SublayerConnection
from transformer_lib.exercises.guards import allclose, assert_close, equal

_NO_LIBRARY = [Refuse((EncoderLayer, "forward"), "EncoderLayer is the course's own layer; write the pre-LN layer "
                      "from the given modules: h = x + self_attn(norm1(x), ...), then h + feed_forward(norm2(h))"),
               Refuse((Encoder, "forward"), "Encoder is the course's own stack; write one pre-LN layer from the given "
                      "modules"),
               Refuse((SublayerConnection, "forward"), "SublayerConnection is the course's own residual block; write "
                      "x + sublayer(norm(x)) yourself with the given modules")]


def _check_padding_mask(padding_mask) -> None:
    generator = fresh_generator()
    B, max_len = int(torch.randint(5, 9, (), generator=generator)), int(torch.randint(1, 9, (), generator=generator))
    drawn = torch.randint(1, max_len + 1, (B,), generator=generator).tolist()
    for lengths, max_len in (([4, 1, 6, 3], 6), ([2, 3], 5), ([3], 3), ([0, 2], 4), (drawn, max_len)):
        lengths = torch.tensor(lengths)
        expected = torch.arange(max_len)[None, :] >= lengths[:, None]       # (B, S), True = padding
        got = call(padding_mask, lengths, max_len, on=f"lengths={lengths.tolist()}, max_len={max_len}"
                   + (" (an empty sentence)" if (lengths == 0).any() else ""))
        assert isinstance(got, torch.Tensor), f"return a torch.Tensor, got {type(got).__name__}"
        B = len(lengths)
        if tuple(got.shape) == (max_len, B) and B != max_len:
            raise AssertionError(f"shape {tuple(got.shape)} is (max_len, B); a key_padding_mask is batch first, "
                                 f"(B, max_len) = ({B}, {max_len})")
        if tuple(got.shape) == (B, int(lengths.max())) and max_len != int(lengths.max()):
            raise AssertionError(f"lengths {lengths.tolist()} with max_len={max_len} gave shape {tuple(got.shape)}: "
                                 "the mask has max_len columns (the padded batch's width), not lengths.max()")
        story = shape_story(tuple(got.shape), (B, max_len), ("B", "max_len"))
        if story and "extra axis" in story:
            story += ("; that is the shape that broadcasts against the (B, H, S, S) scores, but a key_padding_mask "
                      "is (B, S), one row per sentence: the attention adds the axes itself")
        assert got.shape == (B, max_len), story or \
            f"lengths of {B} sentences and max_len={max_len} give shape ({B}, {max_len}), got {tuple(got.shape)}"
        assert got.dtype == torch.bool, (f"the mask must be bool (True = padding), got {got.dtype}; "
                                         f"a float or 0/1 mask is a different convention")
        if equal(got, expected):
            continue
        assert not equal(got, ~expected), ("True must mark the PADDING (PyTorch's key_padding_mask), "
                                                 "your mask marks the real tokens: invert it")
        positions = torch.arange(max_len)[None, :]
        if equal(got, positions > lengths[:, None]):
            raise AssertionError("off by one: position j of a sentence of length n is padding when j >= n "
                                 "(positions count from 0), so the first padded position is j = n itself")
        if equal(got, positions >= max_len - lengths[:, None]):
            raise AssertionError("that is LEFT padding (padding first, then the sentence); the batches here are padded "
                                 "on the right: position j of a sentence of length n is padding when j >= n")
        if equal(got, positions == lengths[:, None]):
            raise AssertionError("only position n is marked; every position j >= n is padding (>=, not ==)")
        if not got.any():
            raise AssertionError("nothing is marked as padding: position j of a sentence of length n is padding when j >= n")
        if equal(got, positions >= lengths[:, None] - 1):
            raise AssertionError("off by one: the last real token (position n - 1) was marked as padding; "
                                 "padding starts at j = n")
        name_difference(got, expected, f"lengths {lengths.tolist()}, max_len={max_len}: ",
                        "; position j of sentence b is padding when j >= its length")
        raise AssertionError(f"for lengths {lengths.tolist()} expected\n{expected.int()}\ngot\n{got.int()}\n"
                             "(position j of sentence b is padding when j >= length)")


def check_padding_mask(your_function) -> None:
    """`padding_mask(lengths, max_len)` -> (B, max_len) bool, True at padded positions."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("padding_mask", your_function, _check_padding_mask)


def _layer_hint(error: Exception) -> str | None:
    if isinstance(error, (TypeError, AttributeError)) and "tuple" in str(error):
        return "self_attn returns a pair (output, weights), as nn.MultiheadAttention does: take [0]"
    if "attn_mask must have shape" in str(error):
        return ("src_key_padding_mask is a (B, S) mask of padded KEYS: pass it as key_padding_mask=...; attn_mask is "
                "the (S, S) mask of (query, key) pairs, which this layer does not use")
    return None


def _layer_variant(case: tuple, layout: str = "pre-LN", mask: str = "given", attn_norm: str = "norm1",
                   normed: str = "query, key and value", res1: str = "x", ff_norm: str = "norm2", ff_reads: str = "h",
                   res2: str = "h", feed_forward: bool = True, out_norm: bool = False) -> torch.Tensor:
    """The pre-LN encoder layer from the given modules with each step a knob: the defaults give the right output,
    one knob turned one usual slip (`name_slip` tries them one and two at a time)."""
    x, attn, ff, norm1, norm2, padding, post_ln = case
    if layout == "post-LN":
        return post_ln(x, src_key_padding_mask=padding)
    key_padding = {"given": padding, "none": None, "inverted": None if padding is None else ~padding}[mask]
    norms = {"norm1": norm1, "norm2": norm2, "none": lambda t: t}
    a = norms[attn_norm](x)
    kv = a if normed == "query, key and value" else x
    h = {"x": x, "norm": a, "none": 0}[res1] + attn(a, kv, kv, key_padding_mask=key_padding)[0]
    out = h
    if feed_forward:
        f = norms[ff_norm]({"h": h, "x": x}[ff_reads])
        out = {"h": h, "x": x, "norm": f, "none": 0}[res2] + ff(f)
    return norm2(out) if out_norm else out


_LAYER_SLIPS = {  # each message, and the knobs of `_layer_variant` that make its slip
    "that is the post-LN layer, LayerNorm(x + Sublayer(x)); pre-LN normalises the sublayer's INPUT and "
    "leaves the residual path alone: x + Sublayer(LayerNorm(x))": dict(layout="post-LN"),
    "the padding mask is ignored: pass src_key_padding_mask to self_attn as key_padding_mask": dict(mask="none"),
    "the padding mask is inverted: True in src_key_padding_mask marks padding, pass it to self_attn "
    "unchanged as key_padding_mask": dict(mask="inverted"),
    "norm1 and norm2 are swapped: norm1 goes before self-attention, norm2 before the feed-forward":
        dict(attn_norm="norm2", ff_norm="norm1"),
    "norm1 was used twice; norm2 (its own gain and bias) goes before the feed-forward: h + FFN(norm2(h))":
        dict(ff_norm="norm1"),
    "norm2 was used twice; norm1 goes before the self-attention: h = x + SelfAttn(norm1(x))": dict(attn_norm="norm2"),
    "the self-attention reads x itself, norm1 is missing; pre-LN normalises each sublayer's input: "
    "h = x + SelfAttn(norm1(x))": dict(attn_norm="none"),
    "the feed-forward reads h itself, norm2 is missing; pre-LN normalises each sublayer's input: "
    "h + FFN(norm2(h))": dict(ff_norm="none"),
    "only the query was normalised; self-attention reads norm1(x) as query, key AND value: "
    "y = norm1(x); self_attn(y, y, y, ...)": dict(normed="query"),
    "the second residual adds x; it must add h, the output of the self-attention block: h + FFN(norm2(h))":
        dict(res2="x"),
    "the residuals add the normalised input; add the input itself: h = x + SelfAttn(norm1(x)), "
    "then h + FFN(norm2(h))": dict(res1="norm", res2="norm"),
    "a LayerNorm was applied to the layer's output; EncoderLayer(norm_first=True) has none (the Encoder "
    "adds one after the last layer)": dict(out_norm=True),
    "the feed-forward block is missing: h + FFN(norm2(h))": dict(feed_forward=False),
    "the second residual adds norm2(h); it adds h itself, the un-normalised output of the self-attention "
    "block: h + FFN(norm2(h))": dict(res2="norm"),
    "the first residual adds norm1(x); it adds x itself: h = x + SelfAttn(norm1(x))": dict(res1="norm"),
    "the feed-forward block has no residual: its output is h + FFN(norm2(h)), not FFN(norm2(h)) alone":
        dict(res2="none"),
    "the self-attention block has no residual: h = x + SelfAttn(norm1(x)), not SelfAttn(norm1(x)) alone":
        dict(res1="none"),
    "the feed-forward reads norm2(x); it must read norm2(h), h = x + SelfAttn(norm1(x)): h + FFN(norm2(h))":
        dict(ff_reads="x"),
}


def _check_pre_ln_encoder_layer(pre_ln_encoder_layer) -> None:
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    _check_layer_with(pre_ln_encoder_layer, 16, 4, torch.Generator().manual_seed(0), padding)
    _check_layer_with(pre_ln_encoder_layer, 16, 4, torch.Generator().manual_seed(1), None)
    _check_layer_with(pre_ln_encoder_layer, 8, 2, torch.Generator().manual_seed(2),
                      torch.tensor([[False] * 3 + [True]]))                       # a batch of one sentence
    generator = fresh_generator()
    B, S, H, d_k = (int(torch.randint(low, high, (), generator=generator)) for low, high in ((1, 4), (2, 8), (1, 4), (2, 6)))
    lengths = torch.randint(1, S + 1, (B,), generator=generator)
    _check_layer_with(pre_ln_encoder_layer, H * d_k, H, generator, torch.arange(S)[None, :] >= lengths[:, None])


def _check_layer_with(pre_ln_encoder_layer, D: int, H: int, generator: torch.Generator,
                      padding: torch.Tensor | None) -> None:
    B, S = (2, 5) if padding is None else padding.shape
    torch.manual_seed(int(torch.randint(2 ** 31, (), generator=generator)))
    layer = EncoderLayer(D, H, 2 * D, dropout=0.0, norm_first=True).eval()
    with torch.no_grad():                  # non-trivial norms, so that a missing or swapped norm shows
        for sublayer in layer.sublayers:
            sublayer.norm.weight.uniform_(0.5, 1.5)
            sublayer.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(B, S, D, generator=generator)
    attn, ff, norm1, norm2 = layer.self_attn, layer.feed_forward, layer.sublayers[0].norm, layer.sublayers[1].norm
    mask_kwargs = {} if padding is None else {"src_key_padding_mask": padding}
    got = call(pre_ln_encoder_layer, x, attn, ff, norm1, norm2, **mask_kwargs, refuse=_NO_LIBRARY, hint=_layer_hint,
               on=f"x of shape (B, S, D) = {tuple(x.shape)} and " + (
                   "no padding mask (src_key_padding_mask left at its default, None)" if padding is None
                   else "a padding mask (B, S)"))
    with torch.no_grad():
        expected = layer(x, src_key_padding_mask=padding)
        post_ln = EncoderLayer(D, H, 2 * D, dropout=0.0).eval()
        post_ln.load_state_dict(layer.state_dict())
    assert isinstance(got, torch.Tensor) and got.shape == x.shape, \
        f"return a tensor of the input's shape {tuple(x.shape)}, got {getattr(got, 'shape', type(got).__name__)}"
    got = got.detach()
    if allclose(got, expected, atol=1e-5):
        return
    with torch.no_grad():
        slip = name_slip([got], [(x, attn, ff, norm1, norm2, padding, post_ln)], _layer_variant, _LAYER_SLIPS,
                         lambda mine, wrong: bool(wrong.isfinite().all()) and allclose(mine, wrong, atol=1e-5))
    if slip:
        raise AssertionError(slip)
    if padding is not None and allclose(got[~padding], expected[~padding], atol=1e-5):
        raise AssertionError("the real positions are right, but you changed the outputs at the padded positions; "
                             "leave them as the layer computes them (the mask only keeps keys out of attention)")
    with torch.no_grad():
        again = pre_ln_encoder_layer(x, attn, ff, norm1, norm2, **mask_kwargs)
    if not allclose(got, again.detach(), atol=1e-6):
        raise AssertionError("two calls with the same input gave different outputs: the layer must be deterministic "
                             "here (dropout 0; F.dropout(x, p) drops by default, training=True)")
    name_difference(got, expected, "pre_ln_encoder_layer: ", "; h = x + SelfAttn(norm1(x)), then h + FFN(norm2(h))")
    assert_close(got, expected, atol=1e-5, rtol=0, msg=lambda m: (
        "differs from EncoderLayer(norm_first=True): h = x + SelfAttn(norm1(x)), then "
        "h + FFN(norm2(h)), with no LayerNorm on the output\n" + m))


def check_pre_ln_encoder_layer(your_function) -> None:
    """`pre_ln_encoder_layer(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask)` equals
    `EncoderLayer(norm_first=True)`."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("pre_ln_encoder_layer", your_function, _check_pre_ln_encoder_layer)
