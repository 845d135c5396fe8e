"""Checkers for the exercises of notebook 08 (the decoder). Hand-written, not exported from a notebook."""
from unittest import mock

import torch

from transformer_lib.attention import subsequent_mask
from transformer_lib.decoder import Decoder
from transformer_lib.exercises import run_checker


def _no_triu(*args, **kwargs):
    raise AssertionError("build the mask without torch.triu (or subsequent_mask, which uses it): compare "
                         "a column of query positions with a row of key positions made by torch.arange")


def check_causal_mask(your_function) -> bool:
    """`causal_mask(T)` equals `subsequent_mask(T)` for several T, built without torch.triu."""
    def check(causal_mask):
        for T in [5, 8, 2, 1]:
            expected = subsequent_mask(T)
            with mock.patch("torch.triu", _no_triu), mock.patch.object(torch.Tensor, "triu", _no_triu):
                got = causal_mask(T)
            assert isinstance(got, torch.Tensor), f"return a torch.Tensor, got {type(got).__name__}"
            assert got.shape == (T, T), f"causal_mask({T}) must have shape ({T}, {T}), got {tuple(got.shape)}"
            assert got.dtype == torch.bool, f"the mask must be bool (True = may not attend), got {got.dtype}"
            if T > 1:
                assert not torch.equal(got, ~expected), ("True must mean 'may NOT attend' (the future keys, above "
                                                         "the diagonal); your mask marks the allowed keys")
                assert not torch.equal(got, expected.T), ("that blocks the PAST: row i is the query, column j the "
                                                          "key, and query i may not look at keys j > i")
            assert not got.diagonal().any(), "the diagonal must be False: position i may attend to itself"
            assert torch.equal(got, expected), f"causal_mask({T}) should be\n{expected.int()}\ngot\n{got.int()}"
    return run_checker("causal_mask", your_function, check)


def check_is_causal(your_function) -> bool:
    """`is_causal(decoder, tgt, memory)` tells causal decoders from ones where some output sees the future."""
    def check(is_causal):
        torch.manual_seed(0)
        D, T, S = 16, 6, 4
        stack = Decoder(D, 4, 32, n_layers=2, dropout=0.0).eval()
        tgt, memory = torch.randn(2, T, D), torch.randn(2, S, D)

        def masked(tgt, memory):
            return stack(tgt, memory, tgt_mask=subsequent_mask(tgt.size(1)))

        def unmasked(tgt, memory):
            return stack(tgt, memory)

        def last_leaks_into_first(tgt, memory):    # causal except: output 0 also sees the LAST position
            out = masked(tgt, memory).clone()
            out[:, 0] = out[:, 0] + 0.01 * tgt[:, -1]
            return out

        def next_leaks(tgt, memory):               # causal except: output 2 also sees position 3
            out = masked(tgt, memory).clone()
            out[:, 2] = out[:, 2] + 0.01 * tgt[:, 3]
            return out

        with torch.no_grad():
            answer = is_causal(masked, tgt, memory)
            assert answer in (True, False), f"return True or False, got {answer!r}"
            assert answer, "a decoder with the causal mask is causal, but your function said False"
            assert not is_causal(unmasked, tgt, memory), \
                "a decoder WITHOUT the causal mask sees later positions, but your function said it is causal"
            assert not is_causal(last_leaks_into_first, tgt, memory), (
                "output 0 of this decoder depends on the LAST target position, but your function said it is "
                "causal: change every later position j > i, not only the next one")
            assert not is_causal(next_leaks, tgt, memory), (
                "output 2 of this decoder depends on position 3, but your function said it is causal: check "
                "every output position i, not only the first")
            assert torch.equal(tgt, tgt.clone()) and is_causal(masked, tgt, memory), \
                "your function should not change its inputs (clone tgt before editing it)"
    return run_checker("is_causal", your_function, check)
