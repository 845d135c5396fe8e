"""Checkers for the exercises of notebook 08 (the decoder). Hand-written, not exported from a notebook."""
import torch

from transformer_lib.attention import subsequent_mask
from transformer_lib.decoder import Decoder
from transformer_lib.exercises import Refuse, call, fresh_generator, run_checker
from transformer_lib.exercises.explain import name_difference, what_it_is
from transformer_lib.exercises.guards import equal

_NO_TRIU = [Refuse(name, "build the mask without torch.triu or torch.tril (or subsequent_mask, which uses triu): "
                   "compare a column of query positions with a row of key positions made by torch.arange")
            for name in ("triu", "triu_", "tril", "tril_", "triu_indices", "tril_indices")]
_NO_TRIU.append(Refuse(subsequent_mask, _NO_TRIU[0].message))


def _check_causal_mask(causal_mask) -> None:
    for T in [5, 8, 2, 1, int(torch.randint(9, 40, (), generator=fresh_generator()))]:
        expected = subsequent_mask(T)
        got = call(causal_mask, T, on=f"T={T}", refuse=_NO_TRIU)
        assert isinstance(got, torch.Tensor), f"return a torch.Tensor, got {type(got).__name__}"
        assert got.shape == (T, T), f"causal_mask({T}) must have shape ({T}, {T}), got {tuple(got.shape)}"
        assert got.dtype == torch.bool, f"the mask must be bool (True = may not attend), got {got.dtype}"
        if equal(got, expected):
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
            assert not equal(got, wrong), message
        assert got.any() or T == 1, f"causal_mask({T}) masks nothing: True above the diagonal (key j > query i)"
        name_difference(got, expected, f"causal_mask({T}): ", "; True exactly where key j > query i")
        raise AssertionError(f"causal_mask({T}) should be\n{expected.int()}\ngot\n{got.int()}")


def check_causal_mask(your_function) -> None:
    """`causal_mask(T)` equals `subsequent_mask(T)` for several T, built without torch.triu."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("causal_mask", your_function, _check_causal_mask)


def _leaky(decoder, i: int, j: int, rows: slice = slice(None), strength: float = 0.01):
    """`decoder`, except that output i also sees target position j (in the batch rows `rows` only)."""
    def leaks(tgt, memory):
        out = decoder(tgt, memory).clone()
        out[rows, i] = out[rows, i] + strength * tgt[rows, j]
        return out
    return leaks


def _check_is_causal(is_causal) -> None:
    torch.manual_seed(0)
    D, T, S = 16, 6, 4
    stack = Decoder(D, 4, 32, n_layers=2, dropout=0.0).eval()
    tgt, memory = torch.randn(2, T, D), torch.randn(2, S, D)

    def masked(tgt, memory):
        return stack(tgt, memory, tgt_mask=subsequent_mask(tgt.size(1)))

    def unmasked(tgt, memory):
        return stack(tgt, memory)

    def ignores_tgt(tgt, memory):              # the same output whatever tgt holds: causal
        return memory.mean(dim=1, keepdim=True).expand(-1, tgt.size(1), -1) + 0.0 * tgt

    def own_position_only(tgt, memory):        # output i depends on tgt[:, i] only: causal
        return tgt * memory.mean() + 1.0

    def ask(decoder, what, tgt=tgt, memory=memory):
        answer = call(is_causal, decoder, tgt, memory, on=f"{what} (tgt {tuple(tgt.shape)}, memory "
                      f"{tuple(memory.shape)})")
        if not isinstance(answer, bool):
            got = (f"a tensor of shape {tuple(answer.shape)}" + (f" ({answer!r})" if answer.numel() == 1 else "")
                   if torch.is_tensor(answer) else what_it_is(answer))
            raise AssertionError(f"return True or False, a Python bool, got {got}" + (
                ": turn a one-element tensor into a bool with bool(...) or .item()"
                if torch.is_tensor(answer) and answer.numel() == 1 else ""))
        return answer

    assert ask(ignores_tgt, "a decoder whose output does not depend on tgt at all"), (
        "a decoder whose output does not depend on tgt at all is causal, but your function said False: compare "
        "the outputs before and after changing a later position, and say False only when an EARLIER output moved")
    assert ask(own_position_only, "a decoder where output i depends on tgt[:, i] only"), (
        "output i of this decoder depends on tgt[:, i] and on nothing later, but your function said it is "
        "not causal: changing position j may change outputs j, j + 1, ... (j itself included); only "
        "outputs i < j must stay the same (compare out[:, :j], not out[:, :j + 1])")
    assert ask(masked, "a decoder with the causal mask"), (
        "a decoder with the causal mask is causal, but your function said False: after changing position j, compare "
        "only the EARLIER outputs i < j; outputs j, j + 1, ... may change")
    assert not ask(unmasked, "a decoder without the causal mask"), (
        "a decoder WITHOUT the causal mask sees later positions, but your function said it is causal: " + _DIFFERENT)
    if ask(_leaky(masked, 0, T - 1), "a decoder whose output 0 sees the last position") and not ask(
            _leaky(masked, 0, T - 1, strength=10.0), "a decoder whose output 0 sees the last position strongly"):
        raise AssertionError("output 0 of this decoder depends a little on the last target position (0.01 × its "
                             "value), and your function called it causal, though it caught the same leak when it "
                             "was strong: your comparison is too loose. Compare the earlier outputs with a tight "
                             "tolerance (torch.allclose's default, or atol=1e-6)")
    _check_leaks(lambda i, j: not ask(_leaky(masked, i, j), f"a decoder whose output {i} sees position {j}"), T)
    assert not ask(_leaky(masked, 1, 4, rows=slice(1, None)), "a decoder whose output 1 sees position 4 in the "
                   "second sentence of the batch only"), (
        "in the SECOND sentence of the batch (row 1), output 1 of this decoder depends on position 4, but your "
        "function said it is causal: compare the outputs of every sentence (all batch rows), not only row 0")
    generator = fresh_generator()
    B, T = int(torch.randint(1, 4, (), generator=generator)), int(torch.randint(7, 12, (), generator=generator))
    j = int(torch.randint(6, T, (), generator=generator))                 # beyond the fixed cases' T = 6
    i = int(torch.randint(0, j, (), generator=generator))
    tgt, memory = torch.randn(B, T, D, generator=generator), torch.randn(B, S, D, generator=generator)
    assert ask(masked, "a decoder with the causal mask", tgt, memory), \
        f"a decoder with the causal mask is causal, but your function said False for T={T}"
    assert not ask(_leaky(masked, i, j), f"a decoder whose output {i} sees position {j}", tgt, memory), (
        f"output {i} of this decoder depends on the later position {j} (T={T}), but your function said it is "
        "causal: check every pair of an output i and a later position j > i")
    torch.manual_seed(1)
    pre_ln = Decoder(D, 4, 32, n_layers=2, dropout=0.0, norm_first=True).double().eval()   # float64: no rounding
    tgt, memory = torch.randn(2, 6, D, dtype=torch.float64), torch.randn(2, S, D, dtype=torch.float64)
    assert not ask(lambda tgt, memory: pre_ln(tgt, memory), "a pre-LN decoder without the causal mask", tgt, memory), (
        "a pre-LN decoder WITHOUT the causal mask sees later positions, but your function said it is causal. A pre-LN "
        "decoder reads every position through LayerNorms, which subtract each vector's mean: adding the same number "
        "to every feature of a position moves none of its outputs. " + _DIFFERENT[0].upper() + _DIFFERENT[1:])


_DIFFERENT = ("replace a later position with a different vector (torch.randn_like; a constant shift is removed by "
              "LayerNorm) and compare the earlier outputs with a tolerance (torch.allclose)")


def _check_leaks(caught, T: int) -> None:
    """Decoders with one leak each, output i seeing a later position j: which of them `caught(i, j)` finds tells
    which outputs or which positions the learner's function never looks at."""
    found = {(i, j): caught(i, j) for i, j in ((0, T - 1), (0, 1), (2, 3), (2, T - 1))}
    if all(found.values()):
        return
    missed = ", ".join(f"output {i} sees position {j}" for (i, j), ok in found.items() if not ok)
    if found[0, 1] and found[2, 3] and not found[0, T - 1]:
        story = "change every later position j > i, not only the next one"
    elif found[0, T - 1] and found[2, T - 1] and not found[0, 1] and not found[2, 3]:
        story = (f"you changed only the LAST position (T - 1 = {T - 1}); a leak from an earlier position goes "
                 "unseen. Change each later position j = 1 .. T - 1 in turn, and compare the outputs i < j")
    elif found[0, T - 1] and found[0, 1] and not found[2, 3] and not found[2, T - 1]:
        story = "check every output position i, not only the first"
    else:
        story = "check every pair of an output i and a later position j > i"
    raise AssertionError(f"your function said these decoders are causal, but in each one output i depends on a later "
                         f"position j: {missed} (T = {T}): {story}")


def check_is_causal(your_function) -> None:
    """`is_causal(decoder, tgt, memory)` tells causal decoders from ones where some output sees the future."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("is_causal", your_function, _check_is_causal)
