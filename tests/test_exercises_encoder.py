"""The checkers of notebook 07's exercises: plausible wrong answers -> AssertionError
with a message that says what is wrong, right answers -> True.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import pytest
import torch

from transformer_lib.exercises.encoder import check_padding_mask, check_pre_ln_encoder_layer


def right_padding_mask(lengths, max_len):
    return torch.arange(max_len)[None, :] >= lengths[:, None]


def test_padding_mask_right(capsys):
    assert check_padding_mask(right_padding_mask) is True
    assert "correct: padding_mask" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [
    (lambda lengths, max_len: torch.arange(max_len)[None, :] < lengths[:, None], "marks the real tokens"),
    (lambda lengths, max_len: (torch.arange(max_len)[None, :] >= lengths[:, None]).float(), "must be bool"),
    (lambda lengths, max_len: torch.arange(max_len)[None, :] > lengths[:, None], "j >= length"),
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


def test_pre_ln_right(capsys):
    assert check_pre_ln_encoder_layer(right_pre_ln) is True
    assert "correct: pre_ln_encoder_layer" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [(post_ln, "post-LN"), (no_mask, "padding mask is ignored"),
                                            (normalised_output, "no LayerNorm on the output")])
def test_pre_ln_wrong(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pre_ln_encoder_layer(wrong)
