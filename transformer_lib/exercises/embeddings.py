"""Checkers for the exercises of notebook 02 (token embeddings).

Hand-written, not exported: see `transformer_lib.exercises`. The checkers compare the learner's code
with `F.embedding` (a plain lookup) and with what the paper's scaled embedding must compute.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.embeddings import TokenEmbedding
from transformer_lib.exercises import Refuse, call, fresh_generator, run_checker
from transformer_lib.exercises.explain import name_difference
from transformer_lib.exercises.guards import allclose, assert_close, equal, isclose

_NO_LOOKUP = [Refuse("embedding", "F.embedding (or nn.Embedding) is the lookup itself; the exercise asks for the "
                     "matrix product F.one_hot(tokens, V).to(weight.dtype) @ weight")]


def _one_hot_hint(error: Exception) -> str | None:
    text = str(error)
    if "num_classes" in text or "Class values" in text:
        return ("F.one_hot was given a num_classes that is not larger than every id in tokens: num_classes is the "
                "vocabulary size V = weight.size(0), the number of ROWS of the (V, D) weight")
    if "mat1 and mat2" in text or "size" in text or "shape" in text:
        return ("the one-hot matrix and the weight do not fit together. One-hot vectors need V = weight.size(0) "
                "entries: pass num_classes (F.one_hot alone makes only max(id) + 1 of them), and multiply "
                "one_hot (B, L, V) @ weight (V, D)")
    if "dtype" in text or "scalar type" in text or "Long" in text:
        return "F.one_hot returns integers (torch.long); convert it to the weight's dtype (.to(weight.dtype)) first"
    return None


def _grad_fns(tensor: torch.Tensor) -> set[str]:
    """The names of the autograd nodes that made `tensor`."""
    names, stack, seen = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def _check_lookup_on(embed_by_matmul, tokens: torch.Tensor, weight: torch.Tensor, what: str) -> None:
    got = call(embed_by_matmul, tokens.clone(), weight.clone(), on=what, hint=_one_hot_hint, refuse=_NO_LOOKUP)
    assert isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}"
    shape = (*tokens.shape, weight.size(1))
    assert tuple(got.shape) == shape, f"expected shape (B, L, D) = {shape} for {what}, got {tuple(got.shape)}"
    assert got.dtype == weight.dtype, (f"the result has dtype {got.dtype}, the weight {weight.dtype}: convert the "
                                       "one-hot matrix to weight.dtype, not the weight to another dtype")
    rows = F.embedding(tokens, weight)
    ratio = (got.double() / rows.double())[rows.abs() > 1e-3]
    if ratio.numel() and allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4) and abs(ratio[0] - 1) > 1e-3:
        raise AssertionError(f"your result is the picked rows times {ratio[0].item():.4g}; the lookup returns row t "
                             "unchanged (the scaling belongs to the embedding layer, not to the lookup)")
    name_difference(got, rows, f"for {what}: ", "; one_hot(tokens) @ weight picks row t of the weight for token t")
    assert_close(got, rows, msg=lambda m: (
        f"one_hot(tokens) @ weight must pick row t of the weight for token t ({what}). {m}"))
    # 1 · w + 0 · (the others) is w exactly. Only float64 is held to that: a reduced-precision matmul mode may round
    # float32 products on some CPUs, so float32 is left to assert_close above.
    if weight.dtype == torch.float64 and not equal(got, rows):
        rounded = F.embedding(tokens, weight.float()).to(weight.dtype)
        if equal(got, rounded):
            raise AssertionError(f"for {what}: your result is float64, but its values are the weight's rounded to "
                                 "float32 (about 7 digits): the product ran in float32 and was converted back. Convert "
                                 "the one-hot matrix to weight.dtype and multiply in that dtype; do not convert the "
                                 "weight")
        worst = (got.double() - rows.double()).abs().max().item()
        raise AssertionError(f"for {what}: your result differs from the weight's rows in the last digits (by up to "
                             f"{worst:.3g}); one_hot(tokens) @ weight picks each row EXACTLY (1 · w + 0 · the "
                             "others), so compute in weight.dtype, with nothing else on the way")


def _check_one_hot_lookup(embed_by_matmul) -> None:
    weight = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)      # (V=7, D=3)
    tokens = torch.tensor([[0, 4, 4, 1], [2, 3, 0, 0]])                   # (B, L); the largest id 6 is absent
    _check_lookup_on(embed_by_matmul, tokens, weight, "tokens (B=2, L=4) with ids up to 4 and a weight (V=7, D=3)")
    fixed = torch.Generator().manual_seed(2)       # float64 numbers with more digits than float32 keeps
    _check_lookup_on(embed_by_matmul, tokens[:1], torch.randn(6, 2, dtype=torch.float64, generator=fixed),
                     "tokens (B=1, L=4) and a float64 weight (V=6, D=2)")
    generator = fresh_generator()
    V, D, B, L = (int(torch.randint(low, high, (), generator=generator)) for low, high in ((5, 40), (1, 9), (1, 4), (1, 7)))
    dtype = (torch.float32, torch.float64)[int(torch.randint(2, (), generator=generator))]
    weight = torch.randn(V, D, generator=generator, dtype=dtype)
    tokens = torch.randint(0, V - 1, (B, L), generator=generator)         # the last id never occurs
    _check_lookup_on(embed_by_matmul, tokens, weight, f"tokens (B={B}, L={L}) and a {dtype} weight (V={V}, D={D})")
    weight = torch.randn(50, 8, requires_grad=True)
    tokens = torch.tensor([[3, 3, 49, 7]])
    got = call(embed_by_matmul, tokens, weight, on="a weight that requires grad", hint=_one_hot_hint, refuse=_NO_LOOKUP)
    assert got.requires_grad, "the result must stay differentiable with respect to the weight (no .detach())"
    nodes = _grad_fns(got)
    if not any("Mm" in n or "Matmul" in n for n in nodes) and any("Index" in n or "Embedding" in n for n in nodes):
        raise AssertionError("that is a lookup (indexing or F.embedding); the exercise asks for the matrix product "
                             "F.one_hot(tokens, V).to(weight.dtype) @ weight")
    got.sum().backward()
    assert weight.grad is not None, ("no gradient reached the weight: the result must stay connected to it through "
                                     "autograd (no .detach(), .data or torch.tensor(...) on the way)")
    expected = torch.zeros(50, 8)
    expected[3], expected[49], expected[7] = 2, 1, 1
    assert_close(weight.grad, expected, msg=lambda m: f"the weight's gradient is wrong. {m}")


def check_one_hot_lookup(embed_by_matmul) -> None:
    """`embed_by_matmul(tokens, weight)`: one-hot vectors times the (V, D) weight, equal to a lookup."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("embedding lookup as a one-hot matrix product", embed_by_matmul, _check_one_hot_lookup)


def _table_of(module: nn.Module, vocab_size: int, d_model: int) -> torch.Tensor:
    tables = [p for p in module.parameters() if tuple(p.shape) == (vocab_size, d_model)]
    assert len(tables) == 1, (f"the module must hold exactly one trainable ({vocab_size}, {d_model}) table "
                              f"(an nn.Embedding), found {len(tables)}")
    return tables[0]


_NO_LIBRARY = [Refuse((TokenEmbedding, "__init__"), "that is the course's TokenEmbedding; write the layer yourself "
                      "from one nn.Embedding (or nn.Parameter), its initialisation and the scale")]


def _check_scaled_embedding(module_class) -> None:
    generator = fresh_generator()
    for vocab_size, d_model in ((4000, 256), (2000, 100), (int(torch.randint(1500, 3000, (), generator=generator)),
                                              int(torch.randint(100, 400, (), generator=generator)))):
        _check_scaled_with(module_class, vocab_size, d_model, generator)


def _check_scaled_with(module_class, vocab_size: int, d_model: int, generator: torch.Generator) -> None:
    torch.manual_seed(int(torch.randint(2 ** 31, (), generator=generator)))   # the learner's init draws from here
    module = call(module_class, vocab_size, d_model, on=f"building {module_class.__name__}({vocab_size}, {d_model})",
                  refuse=_NO_LIBRARY)
    assert isinstance(module, nn.Module), f"{module_class.__name__} must be an nn.Module"
    table = _table_of(module, vocab_size, d_model)
    tokens = torch.randint(0, vocab_size, (8, 50), generator=generator)   # (B, L)
    out = call(module, tokens, on="embedding token ids of shape (B=8, L=50)", refuse=_NO_LIBRARY)
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (8, 50, d_model), \
        f"expected output shape (B, L, D) = (8, 50, {d_model}), got {tuple(getattr(out, 'shape', ()))}"
    rows = table[tokens].detach()                                         # (B, L, D)
    out = out.detach()
    slips = {"the output is the raw table row: multiply it by sqrt(d_model) (paper §3.4)": rows,
             "you multiplied by d_model; the paper multiplies by sqrt(d_model)": rows * d_model,
             "you divided by sqrt(d_model); the paper multiplies by it": rows / math.sqrt(d_model)}
    for message, wrong in slips.items():
        if allclose(out, wrong):
            raise AssertionError(message)
    ratio = (out.double() / rows.double())[rows.abs() > 1e-3]
    if ratio.numel() and allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4) \
            and not isclose(ratio[0].item(), math.sqrt(d_model), rel_tol=1e-4):
        raise AssertionError(f"your output is the table row times {ratio[0].item():.4g}; for d_model={d_model} the "
                             f"scale is sqrt(d_model) = {math.sqrt(d_model):.4g}: compute it from d_model "
                             "(math.sqrt(d_model)), do not write a number")
    name_difference(out, rows * math.sqrt(d_model), "", "; the output is table[tokens] * sqrt(d_model)",
                    {"sqrt(d_model)": math.sqrt(d_model), "d_model": d_model})
    assert_close(out, rows * math.sqrt(d_model), msg=lambda m: (
        f"the output must be table[tokens] * sqrt(d_model). {m}"))
    std = table.detach().std().item()
    if abs(std - 1 / d_model) < 0.1 / d_model:
        raise AssertionError(f"the table's entries have std {std:.4f} = 1/d_model: N(0, 1/d_model) means VARIANCE "
                             f"1/d_model, so std = d_model ** -0.5 = {d_model ** -0.5:.4f}")
    assert abs(std - d_model ** -0.5) < 0.1 * d_model ** -0.5, (
        f"the table's entries have std {std:.2g}; initialise them from N(0, 1/d_model), std "
        f"{d_model ** -0.5:.3f} (nn.Embedding's default is N(0, 1), std 1): then the scaled outputs have "
        "unit-variance entries, the same order of size as the positional encodings (RMS 1/√2) they are added to")
    out_std = out.std().item()
    assert abs(out_std - 1) < 0.1, f"the outputs should have std close to 1, got {out_std:.3f}"
    extra = [(name, tuple(p.shape)) for name, p in module.named_parameters() if p.requires_grad and p is not table]
    assert not extra, (
        f"the right outputs, but your module trains more than the table: {', '.join(f'{n} {s}' for n, s in extra)}. "
        "The table is the layer's only parameter; the scale sqrt(d_model) is a constant computed from d_model "
        "(a Python number, or a buffer), not an nn.Parameter, which the optimizer would move away from sqrt(d_model)")


def check_scaled_embedding(module_class) -> None:
    """`ScaledEmbedding(vocab_size, d_model)`: lookup * sqrt(d_model), table from N(0, 1/d_model)."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("the scaled embedding of §3.4", module_class, _check_scaled_embedding)
