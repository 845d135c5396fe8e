"""Checkers for the exercises of notebook 03 (positional encoding).

Hand-written, not exported: see `transformer_lib.exercises`. Each checker compares the learner's
code with `transformer_lib.positional.sinusoidal_table` or with what a learned table must do.
"""
import torch
from torch import nn

from transformer_lib.exercises import run_checker
from transformer_lib.positional import sinusoidal_table


def _check_loop_table(loop_table) -> None:
    for max_len, d_model in [(30, 16), (6, 4), (1, 2)]:
        got = loop_table(max_len, d_model)
        assert isinstance(got, torch.Tensor), f"return a torch.Tensor, got {type(got).__name__}"
        assert tuple(got.shape) == (max_len, d_model), \
            f"loop_table({max_len}, {d_model}) must have shape ({max_len}, {d_model}), got {tuple(got.shape)}"
        expected = sinusoidal_table(max_len, d_model).double()
        got = got.double()
        if max_len > 1 and torch.allclose(got[:-1], expected[1:], atol=1e-6):
            raise AssertionError("your row p holds position p + 1: positions start at 0, so row 0 is "
                                 "[sin 0, cos 0, ...] = [0, 1, 0, 1, ...]")
        swapped = expected.view(max_len, d_model // 2, 2).flip(-1).reshape(max_len, d_model)
        if torch.allclose(got, swapped, atol=1e-6):
            raise AssertionError("sine and cosine are swapped: even columns 2i hold sin, odd columns 2i+1 hold cos")
        if d_model > 2:
            i = torch.arange(d_model // 2, dtype=torch.float64)
            angles = torch.arange(max_len, dtype=torch.float64)[:, None] / 10000 ** (i / d_model)  # (P, D/2)
            wrong = torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(max_len, d_model)
            if torch.allclose(got, wrong, atol=1e-6):
                raise AssertionError("the exponent is 2i / d_model, where i counts pairs (column 2i is pair i); "
                                     "you used i / d_model")
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0, msg=lambda m: (
            f"loop_table({max_len}, {d_model}) differs from sinusoidal_table: {m}\n"
            "PE[pos, 2i] = sin(pos / 10000 ** (2i / d_model)) and PE[pos, 2i+1] = cos(same angle)"))


def check_loop_table(loop_table) -> bool:
    """`loop_table(max_len, d_model)`: the §3.5 table with two Python loops, equal to `sinusoidal_table`."""
    return run_checker("the sinusoidal table with two loops", loop_table, _check_loop_table)


def _check_learned_positions(module_class) -> None:
    torch.manual_seed(0)
    d_model, max_len = 8, 10
    module = module_class(d_model, max_len)
    assert isinstance(module, nn.Module), f"{module_class.__name__} must be an nn.Module subclass"
    parameters = [p for p in module.parameters() if p.requires_grad]
    n_parameters = sum(p.numel() for p in parameters)
    assert n_parameters == max_len * d_model, (
        f"a learned table has max_len * d_model = {max_len * d_model} trainable numbers; your module has "
        f"{n_parameters}. Keep the table as an nn.Embedding or nn.Parameter (a buffer is not trained), "
        "and add no other layer")
    x = torch.randn(3, 7, d_model)                                   # (B, L, D)
    out = module(x)
    assert isinstance(out, torch.Tensor) and out.shape == x.shape, \
        f"the output must have the shape of x, (B, L, D) = {tuple(x.shape)}, got {getattr(out, 'shape', out)}"
    assert not torch.allclose(out[0], out[1]), "return x plus the position vectors, not the position vectors alone"
    added = out - x                                                   # (B, L, D): the position vectors
    torch.testing.assert_close(added[0], added[1], msg=lambda m: (
        "the vector added at a position must not depend on the sentence (the batch row): "
        f"add table rows 0 .. L-1 to every row of the batch. {m}"))
    assert not torch.allclose(added[0, 0], added[0, 1]), "positions 0 and 1 got the same vector: look up row t for position t"
    module.zero_grad()
    out.sum().backward()
    grads = [p.grad for p in parameters]
    assert all(g is not None for g in grads), "no gradient reached the table: is it a trainable parameter?"
    grad = torch.cat([g.reshape(max_len, -1) for g in grads], dim=1)  # (max_len, D)
    used = grad.abs().sum(dim=1) > 0                                  # (max_len,)
    assert used.tolist() == [True] * 7 + [False] * 3, (
        f"a length-7 input must train exactly rows 0..6 of the table; rows with a gradient: "
        f"{used.nonzero().flatten().tolist()}")
    try:
        module(torch.randn(1, max_len + 1, d_model))
    except (IndexError, ValueError, RuntimeError):
        pass
    else:
        raise AssertionError(f"an input of length max_len + 1 = {max_len + 1} must raise an error: the table has "
                             f"no row {max_len}, a learned table cannot extrapolate")


def check_learned_positions(module_class) -> bool:
    """`LearnedPositionalEncoding(d_model, max_len)`: x + a trainable (max_len, d_model) table."""
    return run_checker("learned positional embeddings", module_class, _check_learned_positions)

