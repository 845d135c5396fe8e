"""Checkers for the exercises of notebook 07 (the encoder). Hand-written, not exported from a notebook."""
import torch

from transformer_lib.encoder import EncoderLayer
from transformer_lib.exercises import run_checker


def check_padding_mask(your_function) -> bool:
    """`padding_mask(lengths, max_len)` -> (B, max_len) bool, True at padded positions."""
    def check(padding_mask):
        lengths = torch.tensor([4, 1, 6, 3])
        expected = torch.arange(6)[None, :] >= lengths[:, None]                 # (B, S), True = padding
        got = padding_mask(lengths, 6)
        assert isinstance(got, torch.Tensor), f"return a torch.Tensor, got {type(got).__name__}"
        assert got.shape == (4, 6), f"lengths of 4 sentences and max_len=6 give shape (4, 6), got {tuple(got.shape)}"
        assert got.dtype == torch.bool, (f"the mask must be bool (True = padding), got {got.dtype}; "
                                         f"a float or 0/1 mask is a different convention")
        assert not torch.equal(got, ~expected), ("True must mark the PADDING (PyTorch's key_padding_mask), "
                                                 "your mask marks the real tokens: invert it")
        assert torch.equal(got, expected), (f"for lengths {lengths.tolist()} expected\n{expected.int()}\n"
                                            f"got\n{got.int()}\n(position j of sentence b is padding when j >= length)")
        assert not padding_mask(torch.tensor([3]), 3).any(), "a sentence as long as max_len has no padding"
    return run_checker("padding_mask", your_function, check)


def check_pre_ln_encoder_layer(your_function) -> bool:
    """`pre_ln_encoder_layer(x, self_attn, feed_forward, norm1, norm2, src_key_padding_mask)` equals
    `EncoderLayer(norm_first=True)`."""
    def check(pre_ln_encoder_layer):
        torch.manual_seed(0)
        D, H, F, B, S = 16, 4, 32, 2, 5
        layer = EncoderLayer(D, H, F, dropout=0.0, norm_first=True).eval()
        with torch.no_grad():                  # non-trivial norms, so that a missing or swapped norm shows
            for sublayer in layer.sublayers:
                sublayer.norm.weight.uniform_(0.5, 1.5)
                sublayer.norm.bias.uniform_(-0.5, 0.5)
        x = torch.randn(B, S, D)
        padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
        args = (layer.self_attn, layer.feed_forward, layer.sublayers[0].norm, layer.sublayers[1].norm)
        with torch.no_grad():
            got = pre_ln_encoder_layer(x, *args, src_key_padding_mask=padding)
            expected = layer(x, src_key_padding_mask=padding)
            post_ln = EncoderLayer(D, H, F, dropout=0.0).eval()
            post_ln.load_state_dict(layer.state_dict())
            post = post_ln(x, src_key_padding_mask=padding)
            unmasked = layer(x)
        assert isinstance(got, torch.Tensor) and got.shape == x.shape, \
            f"return a tensor of the input's shape {tuple(x.shape)}, got {getattr(got, 'shape', type(got).__name__)}"
        if torch.allclose(got, post, atol=1e-5):
            raise AssertionError("that is the post-LN layer, LayerNorm(x + Sublayer(x)); pre-LN normalises the "
                                 "sublayer's INPUT and leaves the residual path alone: x + Sublayer(LayerNorm(x))")
        if torch.allclose(got, unmasked, atol=1e-5):
            raise AssertionError("the padding mask is ignored: pass src_key_padding_mask to self_attn "
                                 "as key_padding_mask")
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0, msg=lambda m: (
            "differs from EncoderLayer(norm_first=True): h = x + SelfAttn(norm1(x)), then "
            "h + FFN(norm2(h)), with no LayerNorm on the output\n" + m))
    return run_checker("pre_ln_encoder_layer", your_function, check)
