"""Checkers for the exercises of notebook 03 (positional encoding).

Hand-written, not exported: see `transformer_lib.exercises`. Each checker compares the learner's
code with `transformer_lib.positional.sinusoidal_table` or with what a learned table must do.
"""
import torch
from torch import nn

from transformer_lib.exercises import Refuse, call, fresh_generator, run_checker
from transformer_lib.exercises.explain import name_difference
from transformer_lib.positional import PositionalEncoding, sinusoidal_table
from transformer_lib.exercises.guards import allclose, assert_close, tensor_isclose

_NO_LIBRARY = [Refuse(sinusoidal_table, "sinusoidal_table is the course's own table, the one this exercise asks you "
                      "to write: compute each entry with math.sin / math.cos in two loops"),
               Refuse((PositionalEncoding, "__init__"), "PositionalEncoding holds the course's own table; write the "
                      "entries yourself with two loops")]


def _table(max_len: int, d_model: int, exponent=lambda i, d: 2 * i / d, start: int = 0, layout: str = "interleave",
           cos_exponent=None, multiply: bool = False, angle=None) -> torch.Tensor:
    """Variants of the §3.5 table: the right one with the defaults, a usual slip with an argument changed
    (`angle(pos, i, d_model)`, when given, replaces the angle pos / 10000 ** (2i / d_model) of both columns)."""
    pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]         # (P, 1)
    i = torch.arange(d_model // 2, dtype=torch.float64)                               # (D/2,): pair index
    freq_sin = 10000.0 ** -exponent(i, d_model)
    freq_cos = freq_sin if cos_exponent is None else 10000.0 ** -cos_exponent(i, d_model)
    if multiply:
        freq_sin, freq_cos = 1 / freq_sin, 1 / freq_cos
    sin_angle, cos_angle = (pos * freq_sin, pos * freq_cos) if angle is None else (angle(pos, i, d_model),) * 2
    sin, cos = sin_angle.sin(), cos_angle.cos()                                       # (P, D/2) each
    if layout == "sin":
        sin, cos, layout = sin, cos_angle.sin(), "interleave"
    if layout == "concat":
        return torch.cat([sin, cos], dim=-1)                                          # (P, D)
    table = torch.stack([sin, cos], dim=-1) if layout == "interleave" else torch.stack([cos, sin], dim=-1)
    return table.reshape(max_len, d_model)                                            # (P, D/2, 2) -> (P, D)


_SLIPS = {
    "your row p holds position p + 1: positions start at 0, so row 0 is [sin 0, cos 0, ...] = [0, 1, 0, 1, ...]":
        dict(start=1),
    "sine and cosine are swapped: even columns 2i hold sin, odd columns 2i+1 hold cos": dict(layout="swap"),
    "the exponent is 2i / d_model, where i counts pairs (column 2i is pair i); you used i / d_model":
        dict(exponent=lambda i, d: i / d),
    "you used the column index as 2i: column 2i+1 (the cosine) must use the SAME angle as column 2i, "
    "pos / 10000 ** (2i / d_model), not (2i + 1) / d_model": dict(cos_exponent=lambda i, d: (2 * i + 1) / d),
    "all sines come first, then all cosines (torch.cat); the paper interleaves them: column 2i holds sin, "
    "column 2i+1 the cos of the same angle": dict(layout="concat"),
    "you multiplied pos by 10000 ** (2i / d_model); divide by it: the angle is pos / 10000 ** (2i / d_model)":
        dict(multiply=True),
    "the odd columns hold the SINE too; column 2i+1 holds the cosine of the same angle": dict(layout="sin"),
    "the base is 10000 (the paper's): pos / 10000 ** (2i / d_model); yours is 1000":
        dict(exponent=lambda i, d: 0.75 * 2 * i / d),
    "the exponent is 2i / d_model; you divided by d_model - 1": dict(exponent=lambda i, d: 2 * i / (d - 1)),
    "the exponent counts pairs twice: if your loop runs over the even columns c = 0, 2, 4, ... (range(0, d_model, 2)), "
    "c is already 2i, so the exponent is c / d_model, not 2c / d_model": dict(exponent=lambda i, d: 4 * i / d),
    "your exponent is 0 in every column, so every angle is pos itself: 2 * i // d_model rounds down to 0 (// is "
    "integer division); divide with /: pos / 10000 ** (2 * i / d_model)": dict(angle=lambda pos, i, d: pos + 0 * i),
    "operator precedence: pos / 10000 ** 2 * i / d_model is (pos / 10000²) · i / d_model, since ** binds tighter "
    "than * and /; put the exponent in parentheses: pos / 10000 ** (2 * i / d_model)":
        dict(angle=lambda pos, i, d: pos / 10000 ** 2 * i / d),
    "operator precedence: pos / 10000 ** (2 * i) / d_model divides by d_model outside the power; the exponent is "
    "2i / d_model, all of it in parentheses: pos / 10000 ** (2 * i / d_model)":
        dict(angle=lambda pos, i, d: pos / 10000 ** (2 * i) / d),
    "operator precedence: (pos / 10000) ** (2 * i / d_model) raises pos too; only 10000 is raised to the power: "
    "pos / 10000 ** (2 * i / d_model)": dict(angle=lambda pos, i, d: (pos / 10000) ** (2 * i / d)),
    "you multiplied by 2i / d_model instead of raising 10000 to it: pos / 10000 * (2 * i / d_model); the angle is "
    "pos / 10000 ** (2 * i / d_model)": dict(angle=lambda pos, i, d: pos / 10000 * (2 * i / d)),
}


def _check_loop_table(loop_table) -> None:
    generator = fresh_generator()
    drawn = (int(torch.randint(2, 40, (), generator=generator)), 2 * int(torch.randint(1, 17, (), generator=generator)))
    for max_len, d_model in [(30, 16), (6, 4), (1, 2), drawn]:
        got = call(loop_table, max_len, d_model, on=f"max_len={max_len}, d_model={d_model}", refuse=_NO_LIBRARY)
        assert isinstance(got, torch.Tensor), f"return a torch.Tensor, got {type(got).__name__}"
        assert tuple(got.shape) == (max_len, d_model), \
            f"loop_table({max_len}, {d_model}) must have shape ({max_len}, {d_model}), got {tuple(got.shape)}"
        dtype = got.dtype
        expected = sinusoidal_table(max_len, d_model).double()
        got = got.double()
        if allclose(got, expected, atol=1e-6):
            assert dtype == torch.float64, (f"loop_table({max_len}, {d_model}) has the right values in {dtype}; the "
                                            "exercise asks for float64, the precision of math.sin and math.cos: "
                                            "torch.zeros(max_len, d_model, dtype=torch.float64)")
            continue
        for message, variant in _SLIPS.items():
            wrong = _table(max_len, d_model, **variant)
            if allclose(got, wrong, atol=1e-6) and not allclose(wrong, expected, atol=1e-5):
                raise AssertionError(f"loop_table({max_len}, {d_model}): {message}")
        name_difference(got, expected, f"loop_table({max_len}, {d_model}): ", "; PE[pos, 2i] = sin(pos / 10000 ** "
                        "(2i / d_model)), PE[pos, 2i+1] = cos(same angle)")
        assert_close(got, expected, atol=1e-6, rtol=0, msg=lambda m: (
            f"loop_table({max_len}, {d_model}) differs from sinusoidal_table: {m}\n"
            "PE[pos, 2i] = sin(pos / 10000 ** (2i / d_model)) and PE[pos, 2i+1] = cos(same angle)"))


def check_loop_table(loop_table) -> None:
    """`loop_table(max_len, d_model)`: the §3.5 table with two Python loops, equal to `sinusoidal_table`."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("the sinusoidal table with two loops", loop_table, _check_loop_table)


def _check_learned_positions(module_class) -> None:
    generator = fresh_generator()
    _check_learned_with(module_class, 8, 10, 3, 7, generator)
    _check_learned_with(module_class, 6, 12, 2, 4, generator)
    d_model, max_len = 2 * int(torch.randint(2, 9, (), generator=generator)), int(torch.randint(4, 20, (), generator=generator))
    max_len += max_len == d_model                      # a (d_model, max_len) table stays unambiguous
    _check_learned_with(module_class, d_model, max_len, int(torch.randint(1, 4, (), generator=generator)),
                        int(torch.randint(2, max_len, (), generator=generator)), generator)


def _rows(table: torch.Tensor, max_len: int) -> torch.Tensor:
    """The table as (max_len, D), whichever axis the learner gave its positions."""
    return table.movedim(list(table.shape).index(max_len), 0).reshape(max_len, -1)


def _check_learned_with(module_class, d_model: int, max_len: int, B: int, L: int, generator: torch.Generator) -> None:
    module = call(module_class, d_model, max_len, on=f"building {module_class.__name__}(d_model={d_model}, "
                  f"max_len={max_len})")
    assert isinstance(module, nn.Module), f"{module_class.__name__} must be an nn.Module subclass"
    parameters = [p for p in module.parameters() if p.requires_grad]
    n_parameters = sum(p.numel() for p in parameters)
    assert n_parameters == max_len * d_model, (
        f"a learned table has max_len * d_model = {max_len * d_model} trainable numbers; your module has "
        f"{n_parameters}. Keep the table as an nn.Embedding or nn.Parameter (a buffer is not trained), "
        "and add no other layer")
    with torch.no_grad():                # any initial values are right: give the table distinct rows to test with
        for parameter in parameters:
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    x = torch.randn(B, L, d_model, generator=generator)              # (B, L, D)
    out = call(module, x, on=f"x of shape (B={B}, L={L}, D={d_model})", hint=lambda e: (
        "the length is x.size(1) (x is batch first, (B, L, D)); look up rows torch.arange(L)"
        if isinstance(e, (RuntimeError, IndexError)) else None))
    assert isinstance(out, torch.Tensor) and out.shape == x.shape, \
        f"the output must have the shape of x, (B, L, D) = {tuple(x.shape)}, got {getattr(out, 'shape', out)}"
    assert not allclose(out, out[:1].expand_as(out)) or B == 1, \
        "return x plus the position vectors, not the position vectors alone"
    if len(parameters) == 1 and allclose(out, x * _rows(parameters[0].detach(), max_len)[:L], atol=1e-5):
        raise AssertionError("you multiplied x by the table rows; the positions are ADDED: x + table[:L]")
    added = out - x            # (B, L, D): the position vectors, up to rounding: (x + t) - x is t within 1e-6
    if len(parameters) == 1 and 1 < B <= max_len and allclose(added, _rows(parameters[0].detach(), max_len)[:B, None, :]
                                                   .expand_as(added), atol=1e-5):
        raise AssertionError(f"x of shape (B={B}, L={L}, D={d_model}): batch row b got table row b at every position: "
                             "you numbered the sentences, not the positions. x is batch first, (B, L, D): the length "
                             "is x.size(1), and rows 0 .. L-1 of the table go along that axis (table[:L][None])")
    differs = ~tensor_isclose(added, added[:1].expand_as(added), atol=1e-5, rtol=1e-4).all(dim=-1)   # (B, L)
    if differs.any():
        row, position = differs.nonzero()[0].tolist()
        raise AssertionError(f"the vector added at a position must not depend on the sentence (the batch row): at "
                             f"position {position}, batch row {row} got another vector than row 0. Add table rows "
                             "0 .. L-1 to every row of the batch")
    assert not allclose(added[0, 0], added[0, 1], atol=1e-5), "positions 0 and 1 got the same vector: look up row t for position t"
    if len(parameters) == 1:                         # one table: position t must get its row t
        table = _rows(parameters[0].detach(), max_len)                                  # (max_len, D)
        if allclose(added[0], table[:L].flip(0), atol=1e-5) and L > 1:
            raise AssertionError("the positions are reversed: position t must get row t of the table, not row L-1-t")
        if L < max_len and allclose(added[0], table[1:L + 1], atol=1e-5):
            raise AssertionError("position t got row t + 1: positions count from 0, look up rows torch.arange(L)")
        name_difference(added[0], table[:L], "the vectors your module adds: ", "; position t gets row t of the table")
        assert_close(added[0], table[:L], msg=lambda m: (
            f"position t must get row t of the table (x + table[:L]); yours adds something else: {m}"))
    assert out.requires_grad, ("the output does not depend on the table through autograd (a .detach(), .data or "
                               "torch.tensor(...) on the way?): the table must be trained")
    module.zero_grad()
    out.sum().backward()
    grads = [p.grad for p in parameters]
    assert all(g is not None for g in grads), "no gradient reached the table: is it a trainable parameter?"
    grad = torch.cat([g.movedim(list(g.shape).index(max_len), 0).reshape(max_len, -1) for g in grads], dim=1)  # (max_len, D)
    used = grad.abs().sum(dim=1) > 0                                  # (max_len,)
    assert used.tolist() == [True] * L + [False] * (max_len - L), (
        f"a length-{L} input must train exactly rows 0..{L - 1} of the table; rows with a gradient: "
        f"{used.nonzero().flatten().tolist()}")
    try:
        module(torch.randn(1, max_len + 1, d_model))
    except Exception:                                    # any error will do, the learner's own assert included
        pass
    else:
        raise AssertionError(f"an input of length max_len + 1 = {max_len + 1} must raise an error: the table has "
                             f"no row {max_len}, a learned table cannot extrapolate")


def check_learned_positions(module_class) -> None:
    """`LearnedPositionalEncoding(d_model, max_len)`: x + a trainable (max_len, d_model) table."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("learned positional embeddings", module_class, _check_learned_positions)
