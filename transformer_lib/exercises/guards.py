"""What keeps the checkers fair, shared by all of them (hand-written, not exported).

* `fresh_generator()` / `fresh_random()`: private generators seeded from the operating system, so a
  checker draws new cases on every call (no table of answers passes) without touching the learner's
  global random state.
* `Refuse`: a call the exercise statement forbids (the fused kernel, `F.cross_entropy`, the library's
  own function that the exercise asks to write). `call(..., refuse=[...])` makes each raise an
  AssertionError with its message while the learner's code runs, however the learner imported it.
* `snapshot` / `first_change`: the learner's function must leave its inputs as they were.
* `allclose`, `equal`, `isclose`, `assert_close`: the comparisons every checker uses, bound here when the
  package is imported, so that a learner's code that patches `torch.allclose` (or `math.isclose`, ...)
  cannot make a wrong answer compare equal.
"""
import contextlib
import inspect
import math
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

allclose, equal, tensor_isclose = torch.allclose, torch.equal, torch.isclose   # bound once, at import
assert_close, isclose = torch.testing.assert_close, math.isclose


def fresh_generator() -> torch.Generator:
    """A torch generator of its own, seeded from os.urandom: other values on every call."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))


def fresh_random() -> random.Random:
    """A Python random.Random of its own, seeded from os.urandom."""
    return random.Random(os.urandom(16))


@dataclass(frozen=True)
class Refuse:
    """A call the learner's code may not make, and the message that says why.

    target: a Python function (refused however it was imported), a function written in C (`math.sqrt`,
    a method of a compiled library, refused while the learner's code runs by a profile hook), a pair
    (class, attribute name), or the name of a torch function or Tensor method ("scaled_dot_product_attention",
    "matmul");
    `when(args, kwargs)`, for torch names only, refuses just the calls it returns True for.
    """
    target: object
    message: str
    when: Callable | None = None


class _RefuseTorch(TorchFunctionMode):
    def __init__(self, rules: list[Refuse]):
        super().__init__()
        self.rules = rules

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        for rule in self.rules:
            if name == rule.target and (rule.when is None or rule.when(args, kwargs)):
                raise AssertionError(rule.message)
        return func(*args, **kwargs)


def _refused(*args, _refusal_message="", **kwargs):
    raise AssertionError(_refusal_message)


@contextlib.contextmanager
def _swap_code(function, message: str):
    """Make every call of `function` raise, by swapping its code object (its callers keep their reference)."""
    inner = inspect.unwrap(function)                  # past decorators such as @torch.no_grad()
    if inner.__code__.co_freevars:                    # cannot swap: patch the name in its module instead
        with mock.patch.object(sys.modules[function.__module__], function.__name__,
                               lambda *a, **k: _refused(_refusal_message=message)):
            yield
        return
    saved = inner.__code__, inner.__defaults__, inner.__kwdefaults__
    inner.__code__, inner.__defaults__, inner.__kwdefaults__ = _refused.__code__, None, {"_refusal_message": message}
    try:
        yield
    finally:
        inner.__code__, inner.__defaults__, inner.__kwdefaults__ = saved


@contextlib.contextmanager
def _refuse_builtins(rules: list[Refuse]):
    """Refuse calls of functions written in C, which have no code object to swap: a profile hook sees each call."""
    def hook(frame, event, arg):
        if event == "c_call":
            for rule in rules:
                if arg is rule.target or (getattr(arg, "__name__", None) == getattr(rule.target, "__name__", "")
                                          and getattr(arg, "__self__", None) is getattr(rule.target, "__self__", 0)):
                    raise AssertionError(rule.message)
    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(previous)


@contextlib.contextmanager
def refusing(rules: list[Refuse] | tuple = ()):
    """While the block runs, every call that a rule names raises AssertionError(rule.message)."""
    with contextlib.ExitStack() as stack:
        torch_rules = [rule for rule in rules if isinstance(rule.target, str)]
        builtin_rules = [rule for rule in rules if callable(rule.target) and not isinstance(rule.target, tuple)
                         and not hasattr(inspect.unwrap(rule.target), "__code__")]
        for rule in rules:
            if isinstance(rule.target, tuple):
                owner, attribute = rule.target
                original = inspect.getattr_static(owner, attribute)
                replacement = (lambda *a, _m=rule.message, **k: _refused(_refusal_message=_m))
                if isinstance(original, staticmethod):
                    replacement = staticmethod(replacement)
                stack.enter_context(mock.patch.object(owner, attribute, replacement))
            elif callable(rule.target) and rule not in builtin_rules:
                stack.enter_context(_swap_code(rule.target, rule.message))
        if builtin_rules:
            stack.enter_context(_refuse_builtins(builtin_rules))
        if torch_rules:
            stack.enter_context(_RefuseTorch(torch_rules))
        yield


def matrix_product(args, kwargs) -> bool:
    """For a `Refuse("matmul", ...)`: true when two operands are matrices (a vector times a matrix is allowed)."""
    return sum(isinstance(a, torch.Tensor) and a.dim() >= 2 for a in args) >= 2


MATRIX_PRODUCTS = ("matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "einsum", "tensordot", "addmm", "baddbmm")


class _Opaque:
    """Stands for an input the checker cannot compare (a function, a model it does not own)."""


def snapshot(value):
    """A deep copy of the tensors, modules' weights, lists, tuples, dicts and plain values in `value`."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, nn.Module):
        return {name: tensor.detach().clone() for name, tensor in value.state_dict().items()}
    if isinstance(value, (list, tuple)):
        return (type(value), [snapshot(item) for item in value])
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    return _Opaque()


def _same(before, now) -> bool:
    if isinstance(before, _Opaque):
        return True
    if isinstance(before, torch.Tensor):
        if not isinstance(now, torch.Tensor) or now.shape != before.shape or now.dtype != before.dtype:
            return False
        now = now.detach()
        return bool(((now == before) | (now.isnan() & before.isnan()) if now.is_floating_point()
                     else now == before).all())
    if isinstance(now, nn.Module):
        return _same(before, snapshot(now))
    if isinstance(before, tuple) and len(before) == 2 and isinstance(before[0], type):
        kind, items = before
        return isinstance(now, kind) and len(now) == len(items) and all(map(_same, items, now))
    if isinstance(before, dict):
        return isinstance(now, dict) and before.keys() == now.keys() and all(_same(before[k], now[k]) for k in before)
    return before == now


def first_change(function: Callable, before: tuple, args: tuple, kwargs: dict) -> str | None:
    """The name of the first argument of `function` that differs from its snapshot `before`, else None."""
    before_args, before_kwargs = before
    names = [f"argument {i + 1}" for i in range(len(args))]
    with contextlib.suppress(TypeError, ValueError):
        parameters = list(inspect.signature(function.forward if isinstance(function, nn.Module) else function)
                          .parameters.values())
        if not any(p.kind is p.VAR_POSITIONAL for p in parameters[:len(args)]) and len(parameters) >= len(args):
            names = [p.name for p in parameters[:len(args)]]
    for name, old, new in zip(names, before_args, args):
        if not _same(old, new):
            return name
    for name, new in kwargs.items():
        if not _same(before_kwargs[name], new):
            return name
    return None
