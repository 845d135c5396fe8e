"""Checkers for the exercises of notebook 08 (the decoder). Hand-written, not exported from a notebook."""
from unittest import mock

import torch

from transformer_lib.attention import subsequent_mask
from transformer_lib.decoder import Decoder
from transformer_lib.exercises import call, run_checker


def _no_triu(*args, **kwargs):
    raise AssertionError("build the mask without torch.triu (or subsequent_mask, which uses it): compare "
                         "a column of query positions with a row of key positions made by torch.arange")


def _check_causal_mask(causal_mask) -> None:
    for T in [5, 8, 2, 1]:
        expected = subsequent_mask(T)
        with mock.patch("torch.triu", _no_triu), mock.patch.object(torch.Tensor, "triu", _no_triu):
            got = call(causal_mask, T, on=f"T={T}")
        assert isinstance(got, torch.Tensor), f"return a torch.Tensor, got {type(got).__name__}"
        assert got.shape == (T, T), f"causal_mask({T}) must have shape ({T}, {T}), got {tuple(got.shape)}"
        assert got.dtype == torch.bool, f"the mask must be bool (True = may not attend), got {got.dtype}"
        if torch.equal(got, expected):
            continue
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]       # (T, 1) queries, (1, T) keys
        slips = {
            "True must mean 'may NOT attend' (the future keys, above the diagonal); your mask marks the allowed "
            "keys": ~expected,
            "that blocks the PAST: row i is the query, column j the key, and query i may not look at keys j > i":
                expected.T,
            "the diagonal must be False: position i may attend to itself (j > i, not j >= i)": j >= i,
            "off by one: query i may see key i + 1 in your mask; block every key j > i": j > i + 1,
        }
        for message, wrong in slips.items():
            assert not torch.equal(got, wrong), message
        raise AssertionError(f"causal_mask({T}) should be\n{expected.int()}\ngot\n{got.int()}")


def check_causal_mask(your_function) -> None:
    """`causal_mask(T)` equals `subsequent_mask(T)` for several T, built without torch.triu."""
    run_checker("causal_mask", your_function, _check_causal_mask)


def _check_is_causal(is_causal) -> None:
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

    def memory_only(tgt, memory):              # depends on tgt only through its own position: causal
        return masked(tgt, memory) * 0 + tgt * memory.mean()

    def ask(decoder, what):
        tgt_in, memory_in = tgt.clone(), memory.clone()
        answer = call(is_causal, decoder, tgt_in, memory_in, on=f"{what} (tgt {tuple(tgt.shape)}, memory "
                      f"{tuple(memory.shape)})")
        assert torch.equal(tgt_in, tgt) and torch.equal(memory_in, memory), \
            "your function changed its inputs: clone tgt before editing a position (tgt.clone())"
        assert isinstance(answer, bool) or (torch.is_tensor(answer) and answer.numel() == 1
                                            and answer.dtype == torch.bool), \
            f"return True or False, got {answer!r}"
        return bool(answer)

    with torch.no_grad():
        assert ask(masked, "a decoder with the causal mask"), \
            "a decoder with the causal mask is causal, but your function said False"
        assert not ask(unmasked, "a decoder without the causal mask"), \
            "a decoder WITHOUT the causal mask sees later positions, but your function said it is causal"
        assert not ask(last_leaks_into_first, "a decoder whose output 0 sees the last position"), (
            "output 0 of this decoder depends on the LAST target position, but your function said it is "
            "causal: change every later position j > i, not only the next one")
        assert not ask(next_leaks, "a decoder whose output 2 sees position 3"), (
            "output 2 of this decoder depends on position 3, but your function said it is causal: check "
            "every output position i, not only the first")
        assert ask(memory_only, "a decoder where output i depends on tgt[:, i] only"), (
            "output i of this decoder depends on tgt[:, i] and on nothing later, but your function said it is "
            "not causal: changing position j may change outputs j, j + 1, ... (j itself included); only "
            "outputs i < j must stay the same")


def check_is_causal(your_function) -> None:
    """`is_causal(decoder, tgt, memory)` tells causal decoders from ones where some output sees the future."""
    run_checker("is_causal", your_function, _check_is_causal)
