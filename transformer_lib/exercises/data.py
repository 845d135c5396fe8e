"""Checkers for the coding exercises of notebook 10 (the data pipeline): `check_…(your_function)`.

Hand-written, not exported (see `transformer_lib.exercises`). Each checker runs the learner's
function on small inputs and compares it with a reference written here or with `transformer_lib.data`.
"""
import torch

from transformer_lib.data import token_batches
from transformer_lib.exercises import call, fresh_random, run_checker
from transformer_lib.exercises.explain import name_difference, name_slip, what_it_is
from transformer_lib.exercises.guards import equal

# Lengths (source, target) in tokens, chosen so that the real-token and the padded-token rules differ.
_LENGTHS = [(3, 4), (5, 2), (2, 2), (6, 6), (1, 9), (4, 4), (2, 3), (3, 1), (10, 2), (1, 1)]


def _real_token_batches(lengths: list[tuple[int, int]], max_tokens: int, rule: str = "right") -> list[list[int]]:
    """Reference: in the given order, close a batch when one more example would put more than
    `max_tokens` real tokens on either side (`rule` other than "right": a usual slip)."""
    too_many = {"right": lambda s, t: s > max_tokens or t > max_tokens,
                "strict": lambda s, t: s >= max_tokens or t >= max_tokens,
                "source only": lambda s, t: s > max_tokens,
                "sum": lambda s, t: s + t > max_tokens, "no reset": lambda s, t: s > max_tokens or t > max_tokens}[rule]
    batches, current, src_sum, tgt_sum = [], [], 0, 0
    for i, (s, t) in enumerate(lengths):
        if current and too_many(src_sum + s, tgt_sum + t):
            batches.append(current)
            current = []
            if rule != "no reset":
                src_sum, tgt_sum = 0, 0
        current.append(i)
        src_sum, tgt_sum = src_sum + s, tgt_sum + t
    return batches + [current] if current else batches


def _batch_cases() -> list[tuple[list[tuple[int, int]], int]]:
    """The fixed lengths with three budgets, an oversized first example, none at all, then lengths drawn afresh."""
    rng = fresh_random()
    drawn = [(rng.randint(1, 12), rng.randint(1, 12)) for _ in range(rng.randint(11, 16))]
    budget = rng.randint(8, 20)
    drawn[rng.randrange(len(drawn))] = (budget + rng.randint(1, 5), 1)      # one example too long for any batch
    return [(_LENGTHS, 10), (_LENGTHS, 12), (_LENGTHS, 30), ([(12, 1), (1, 1), (2, 2)], 10),
            ([(2, 3), (4, 1), (1, 14), (3, 3)], 10), ([], 10), (drawn, budget)]


def _check_batches_on(fn, lengths: list[tuple[int, int]], max_tokens: int) -> None:
    expected = _real_token_batches(lengths, max_tokens)
    got = call(fn, lengths, max_tokens, on=f"lengths={lengths}, max_tokens={max_tokens}"
               + (" (no examples)" if not lengths else ""))
    assert isinstance(got, (list, tuple)) and all(isinstance(b, (list, tuple)) for b in got), \
        f"return a list of batches, each a list of example indices, got {got!r}"
    raw, got = got, [list(b) for b in got]
    if not lengths:
        assert got == [], f"for no examples return no batches, [], got {got}"
    assert [] not in got, (f"lengths={lengths}, max_tokens={max_tokens} gave an empty batch: open a new batch only "
                           "when the current one holds at least one example (an example too long for any batch "
                           "gets a batch of its own)")
    too_long = [i for i, (s, t) in enumerate(lengths) if s > max_tokens or t > max_tokens]
    seen = sorted(i for b in got for i in b)
    if set(too_long) - set(seen):
        raise AssertionError(f"example(s) {sorted(set(too_long) - set(seen))} of lengths={lengths} hold more than "
                             f"max_tokens={max_tokens} tokens and were dropped: an example too long for any batch "
                             "gets a batch of its own")
    if seen != list(range(len(lengths))):
        missing = sorted(set(range(len(lengths))) - set(seen))
        twice = sorted({i for i in seen if seen.count(i) > 1})
        story = (f" The examples missing are those of the last batch, {expected[-1]}: after the loop, append the "
                 "batch still open (when it holds an example)" if expected and missing == expected[-1] else "")
        raise AssertionError(f"lengths={lengths}, max_tokens={max_tokens}: every example index must appear in "
                             f"exactly one batch; expected {expected}, got {got}: "
                             + "; ".join(part for part in (f"{missing} in no batch" if missing else "",
                                                           f"{twice} twice" if twice else "",
                                                           f"{sorted(set(seen) - set(range(len(lengths))))} are no "
                                                           "example index" if set(seen) - set(range(len(lengths)))
                                                           else "") if part) + "." + story)
    assert [i for b in got for i in b] == list(range(len(lengths))), (
        "keep the examples in the order given (no sorting, no shuffling)")
    for i in too_long:
        batch = next(b for b in got if i in b)
        assert batch == [i], (f"example {i} {lengths[i]} is longer than max_tokens={max_tokens} by itself, so it "
                              f"gets a batch of its own, not {batch}")
    try:
        padded = [list(b) for b in token_batches(lengths, max_tokens, shuffle=False, bucket=False)]
    except ValueError:                                      # it refuses an example longer than max_tokens
        padded = None
    if got == padded and got != expected:
        raise AssertionError("these are the course's batches: they cap the PADDED size, B times the "
                             "longest sentence; this rule counts REAL tokens, the sum of the lengths")
    slips = {"strict": "a batch of exactly max_tokens real tokens is allowed: close it only when the next "
                       "example would go OVER max_tokens (>, not >=)",
             "source only": "count the target side too: close a batch when either side would go over max_tokens",
             "sum": "count each side on its own: the source tokens must fit max_tokens, and so must the "
                    "target tokens (not their sum)",
             "no reset": "the token counts must start again from 0 (plus the new example) when a new batch opens; "
                         "yours keep growing, so every later batch holds one example"}
    for rule, message in slips.items():
        if got == _real_token_batches(lengths, max_tokens, rule) != expected:
            raise AssertionError(f"max_tokens={max_tokens}: {message}")
    for b in got:
        src, tgt = sum(lengths[i][0] for i in b), sum(lengths[i][1] for i in b)
        assert len(b) == 1 or (src <= max_tokens and tgt <= max_tokens), (
            f"batch {b} holds {src} source and {tgt} target tokens, more than max_tokens={max_tokens}")
    assert got == expected, (
        f"lengths={lengths}, max_tokens={max_tokens}: expected {expected}, got {got}; close a batch only when the "
        "next example would push either side over max_tokens (a batch of exactly max_tokens is allowed)")
    odd = raw if not isinstance(raw, list) else next((b for b in raw if not isinstance(b, list)), None)
    assert odd is None, (f"lengths={lengths}, max_tokens={max_tokens}: the right batches, but return a list of "
                         f"batches, each a list of example indices, as the statement asks; you returned "
                         f"{what_it_is(odd) if odd is not raw else what_it_is(raw)}" + ("" if odd is raw else " as a batch"))


def check_real_token_batches(your_function) -> None:
    """`your_function(lengths, max_tokens)` -> batches of indices, budget counted in real tokens."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def _check(fn):
        for lengths, max_tokens in _batch_cases():
            _check_batches_on(fn, lengths, max_tokens)
    run_checker("batches by real tokens", your_function, _check)


def _target_mask(tgt_in: torch.Tensor, pad_id: int) -> torch.Tensor:
    T = tgt_in.size(1)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)   # (T, T): True above the diagonal
    return causal | (tgt_in == pad_id)[:, None, :]                         # (B, T, T): keys that are padding


def _mask_cases() -> list[tuple[torch.Tensor, int]]:
    """The fixed batch with pad_id 0, one whose pad_id is 7 and holds real 0s, then one drawn afresh."""
    rng = fresh_random()
    B, T, pad = rng.randint(4, 6), rng.randint(6, 9), rng.randint(1, 30)
    drawn = torch.tensor([[rng.choice([i for i in range(31) if i != pad]) for _ in range(T)] for _ in range(B)])
    for row in drawn:
        row[rng.randint(1, T):] = pad                                        # right padding, some rows none
    return [(torch.tensor([[1, 5, 6, 7, 8], [1, 9, 4, 0, 0], [1, 3, 0, 0, 0]]), 0),
            (torch.tensor([[1, 0, 6, 7], [1, 0, 7, 7]]), 7), (drawn, pad)]


def _check_mask_on(fn, tgt_in: torch.Tensor, pad: int) -> None:
    expected = _target_mask(tgt_in, pad)
    got = call(fn, tgt_in, pad, on=f"tgt_in of shape (B, T) = {tuple(tgt_in.shape)} with pad_id={pad}")
    assert isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}"
    assert got.shape == expected.shape, f"expected shape (B, T, T) = {tuple(expected.shape)}, got {tuple(got.shape)}"
    assert got.dtype == torch.bool, f"return a boolean mask (dtype torch.bool), got {got.dtype}"
    if equal(got, expected):
        return
    if equal(got, ~expected):
        raise AssertionError("the mask is inverted: True must mean NOT allowed (PyTorch's convention)")
    T = tgt_in.size(1)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    padding = (tgt_in == pad)[:, None, :]
    if equal(got, causal & padding):
        raise AssertionError("combine the two masks with | (or): a key is blocked if it is in the future OR "
                             "padding; & blocks only keys that are both")
    if equal(got, causal | (tgt_in != pad)[:, None, :]):
        raise AssertionError("you masked the keys that are real tokens; mask those that ARE padding: "
                             "(tgt_in == pad_id)[:, None, :]")
    if equal(got, expected.transpose(1, 2)):
        raise AssertionError("the mask is transposed: row t is the query, column j the key; query t may not see "
                             "a later key j > t or a padding key")
    if pad != 0 and equal(got, _target_mask(tgt_in, 0)):
        raise AssertionError(f"with pad_id={pad} you masked the keys whose token is 0: compare with the pad_id "
                             "argument, (tgt_in == pad_id), not with a fixed 0")
    real = tgt_in != pad                                                     # (B, T)
    assert not got.diagonal(dim1=1, dim2=2)[real].any(), \
        "a position may attend to itself: the diagonal of a real token must be False"
    if equal(got, causal.expand_as(expected)) and padding.any():
        raise AssertionError("padding is not masked: keys whose token is pad_id must be True in every row")
    if equal(got, causal | (tgt_in == pad)[:, :, None]):
        raise AssertionError("you masked padding QUERIES (rows); mask padding KEYS (the last axis, columns): "
                             "(tgt_in == pad_id)[:, None, :]")
    unpadded = real.all(dim=1)
    assert all(equal(got[b], causal) for b in unpadded.nonzero().flatten().tolist()), (
        "a row without padding gets the causal mask alone: True above the diagonal (key j > query t), False on and "
        "below it")
    name_difference(got, expected, f"tgt_in {tuple(tgt_in.shape)}, pad_id={pad}: ", "; True where key j > query t "
                    "or key j is padding")
    assert equal(got, expected), (
        "mask padding KEYS (the last axis, columns), for every query; queries at padding may stay as they are")


def _mask_variant(case, causal: str = "later", padding: str = "keys", pad_value: str = "pad_id",
                  combine: str = "or") -> torch.Tensor:
    """The reference mask with each of its parts a knob: which keys the causal part blocks, where the padding
    goes (keys, queries, the real keys), what counts as padding, and how the two parts are combined."""
    tgt_in, pad = case
    T = tgt_in.size(1)
    t, j = torch.arange(T)[:, None], torch.arange(T)[None, :]                  # (T, 1) queries, (1, T) keys
    blocked = {"later": j > t, "earlier": j < t, "later and itself": j >= t,
               "none": torch.zeros(T, T, dtype=torch.bool)}                          # (T, T)
    is_pad = tgt_in == (pad if pad_value == "pad_id" else 0)                      # (B, T)
    padded = {"keys": is_pad[:, None, :], "queries": is_pad[:, :, None], "real keys": ~is_pad[:, None, :],
              "none": torch.zeros_like(is_pad)[:, None, :]}
    return blocked[causal] | padded[padding] if combine == "or" else blocked[causal] & padded[padding]


_MASK_SLIPS = {
    "the causal part is transposed: query t (row) may not see LATER keys j > t; your mask blocks the earlier keys "
    "j < t": {"causal": "earlier"},
    "a position may attend to itself: the diagonal of a real token must be False (block keys j > t, not j ≥ t)":
        {"causal": "later and itself"},
    "the causal part is missing: key j > query t is True in every row, padding or not": {"causal": "none"},
    "you masked padding QUERIES (rows); mask padding KEYS (the last axis, columns): (tgt_in == pad_id)[:, None, :]":
        {"padding": "queries"},
    "you masked the keys that are real tokens; mask those that ARE padding: (tgt_in == pad_id)[:, None, :]":
        {"padding": "real keys"},
    "padding is not masked: keys whose token is pad_id must be True in every row": {"padding": "none"},
    "you masked the keys whose token is 0: compare with the pad_id argument, (tgt_in == pad_id), not with a fixed 0":
        {"pad_value": "0"},
    "combine the two masks with | (or): a key is blocked if it is in the future OR padding; & blocks only keys "
    "that are both": {"combine": "and"},
}


def check_target_mask(your_function) -> None:
    """`your_function(tgt_in (B, T), pad_id)` -> bool (B, T, T), True where query t may NOT attend key j."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def _check(fn):
        cases, outputs = _mask_cases(), []
        for tgt_in, pad in cases:
            got = call(fn, tgt_in, pad, on=f"tgt_in of shape (B, T) = {tuple(tgt_in.shape)} with pad_id={pad}")
            outputs.append(got)
            same = isinstance(got, torch.Tensor) and got.shape == (tgt_in.size(0), tgt_in.size(1), tgt_in.size(1)) \
                and got.dtype == torch.bool
            if not same:
                _check_mask_on(lambda *a: got, tgt_in, pad)                        # says what is wrong with it
        if all(equal(got, _target_mask(*case)) for got, case in zip(outputs, cases)):
            return
        slip = name_slip(outputs, cases, _mask_variant, _MASK_SLIPS, equal)
        if slip:
            tgt_in, pad = next(case for got, case in zip(outputs, cases) if not equal(got, _target_mask(*case)))
            raise AssertionError(f"tgt_in {tuple(tgt_in.shape)}, pad_id={pad}: {slip}")
        for got, (tgt_in, pad) in zip(outputs, cases):
            _check_mask_on(lambda *a, got=got: got, tgt_in, pad)
    run_checker("causal and padding mask of the target", your_function, _check)
