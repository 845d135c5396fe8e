"""Checkers for the exercises of notebook 02 (token embeddings).

Hand-written, not exported: see `transformer_lib.exercises`. The checkers compare the learner's code
with `F.embedding` (a plain lookup) and with what the paper's scaled embedding must compute.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.exercises import call, run_checker


def _one_hot_hint(error: Exception) -> str | None:
    text = str(error)
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


def _check_one_hot_lookup(embed_by_matmul) -> None:
    weight = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)      # (V=7, D=3)
    tokens = torch.tensor([[0, 4, 4, 1], [2, 3, 0, 0]])                   # (B, L); the largest id 6 is absent
    got = call(embed_by_matmul, tokens.clone(), weight.clone(), on="tokens (B=2, L=4) with ids up to 4 and a "
               "weight (V=7, D=3)", hint=_one_hot_hint)
    assert isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}"
    assert tuple(got.shape) == (2, 4, 3), f"expected shape (B, L, D) = (2, 4, 3), got {tuple(got.shape)}"
    assert got.dtype == weight.dtype, (f"the result has dtype {got.dtype}, the weight {weight.dtype}: convert the "
                                       "one-hot matrix to weight.dtype, not the weight to another dtype")
    torch.testing.assert_close(got, F.embedding(tokens, weight), msg=lambda m: (
        f"one_hot(tokens) @ weight must pick row t of the weight for token t. {m}"))
    weight = torch.randn(50, 8, requires_grad=True)
    tokens = torch.tensor([[3, 3, 49, 7]])
    got = call(embed_by_matmul, tokens, weight, on="a weight that requires grad", hint=_one_hot_hint)
    assert got.requires_grad, "the result must stay differentiable with respect to the weight (no .detach())"
    nodes = _grad_fns(got)
    if not any("Mm" in n or "Matmul" in n for n in nodes) and any("Index" in n or "Embedding" in n for n in nodes):
        raise AssertionError("that is a lookup (indexing or F.embedding); the exercise asks for the matrix product "
                             "F.one_hot(tokens, V).to(weight.dtype) @ weight")
    got.sum().backward()
    expected = torch.zeros(50, 8)
    expected[3], expected[49], expected[7] = 2, 1, 1
    torch.testing.assert_close(weight.grad, expected, msg=lambda m: f"the weight's gradient is wrong. {m}")


def check_one_hot_lookup(embed_by_matmul) -> None:
    """`embed_by_matmul(tokens, weight)`: one-hot vectors times the (V, D) weight, equal to a lookup."""
    run_checker("embedding lookup as a one-hot matrix product", embed_by_matmul, _check_one_hot_lookup)


def _table_of(module: nn.Module, vocab_size: int, d_model: int) -> torch.Tensor:
    tables = [p for p in module.parameters() if tuple(p.shape) == (vocab_size, d_model)]
    assert len(tables) == 1, (f"the module must hold exactly one trainable ({vocab_size}, {d_model}) table "
                              f"(an nn.Embedding), found {len(tables)}")
    return tables[0]


def _check_scaled_embedding(module_class) -> None:
    torch.manual_seed(0)
    vocab_size, d_model = 4000, 256
    module = call(module_class, vocab_size, d_model, on=f"building {module_class.__name__}({vocab_size}, {d_model})")
    assert isinstance(module, nn.Module), f"{module_class.__name__} must be an nn.Module"
    table = _table_of(module, vocab_size, d_model)
    tokens = torch.randint(0, vocab_size, (8, 50))                        # (B, L)
    out = call(module, tokens, on="embedding token ids of shape (B=8, L=50)")
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (8, 50, d_model), \
        f"expected output shape (B, L, D) = (8, 50, {d_model}), got {tuple(getattr(out, 'shape', ()))}"
    rows = table[tokens].detach()                                         # (B, L, D)
    out = out.detach()
    slips = {"the output is the raw table row: multiply it by sqrt(d_model) (paper §3.4)": rows,
             "you multiplied by d_model; the paper multiplies by sqrt(d_model)": rows * d_model,
             "you divided by sqrt(d_model); the paper multiplies by it": rows / math.sqrt(d_model)}
    for message, wrong in slips.items():
        if torch.allclose(out, wrong):
            raise AssertionError(message)
    torch.testing.assert_close(out, rows * math.sqrt(d_model), msg=lambda m: (
        f"the output must be table[tokens] * sqrt(d_model). {m}"))
    std = table.detach().std().item()
    if abs(std - 1 / d_model) < 0.1 / d_model:
        raise AssertionError(f"the table's entries have std {std:.4f} = 1/d_model: N(0, 1/d_model) means VARIANCE "
                             f"1/d_model, so std = d_model ** -0.5 = {d_model ** -0.5:.4f}")
    assert abs(std - d_model ** -0.5) < 0.1 * d_model ** -0.5, (
        f"the table's entries have std {std:.3f}; initialise them from N(0, 1/d_model), std "
        f"{d_model ** -0.5:.3f} (nn.Embedding's default is N(0, 1), std 1): then the scaled outputs have "
        "std 1, like the positional encodings")
    out_std = out.std().item()
    assert abs(out_std - 1) < 0.1, f"the outputs should have std close to 1, got {out_std:.3f}"


def check_scaled_embedding(module_class) -> None:
    """`ScaledEmbedding(vocab_size, d_model)`: lookup * sqrt(d_model), table from N(0, 1/d_model)."""
    run_checker("the scaled embedding of §3.4", module_class, _check_scaled_embedding)
