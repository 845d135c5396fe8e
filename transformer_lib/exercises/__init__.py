"""Checkers for the course's coding exercises: `check_…(your_function)`, one module per notebook.

Where a notebook's checks are long, its module keeps the public `check_…` and a helper module holds the checks
behind them (`schedule` for notebook 11's learning-rate exercises, `greedy` for notebook 12's decoder, `ring`
for notebook 14's all-reduce); import the checkers from the notebook's module, as the notebooks do.

Hand-written, not exported: the checkers are not part of the Transformer, and they ship with the
package so that a learner on Colab or with a downloaded notebook can call them. Each checker runs
the learner's function on small inputs and compares it with the course's own code or PyTorch's:

* a correct answer prints "correct: …";
* an exercise not attempted yet (the stub still raises NotImplementedError) prints what to do, so
  that "Run all" goes on to the end of the notebook;
* a wrong answer raises AssertionError with a message that says what is wrong; where a plausible
  mistake explains the answer, the checker computes that mistaken variant too and names it;
* an exception raised inside the learner's function becomes an AssertionError that names it, the
  input that caused it and a hint (`call`); its traceback keeps the learner's own frames and drops the
  checker's, and a wrong answer's AssertionError comes without the checker's frames; an exception in the
  checker itself is left alone, whole;
* on top of fixed cases that catch each usual slip, a checker draws fresh random cases on every call
  (`guards.fresh_generator`), refuses the shortcuts the statement forbids (`guards.Refuse`) and checks
  that the learner's function leaves its inputs unchanged; the learner's random state is restored.

Checkers return None, so that a notebook cell that ends with `check_…(f)` prints only the message.
The solutions are in `solutions/NN_*.ipynb` of the repository, apart from the notebooks.
"""
import os
import random
from collections.abc import Callable, Sequence

import torch

from transformer_lib.exercises.guards import (MATRIX_PRODUCTS, Refuse, first_change, fresh_generator, fresh_random,
                                              matrix_product, refusing, snapshot)

__all__ = ["MATRIX_PRODUCTS", "Refuse", "call", "fresh_generator", "fresh_random", "matrix_product", "run_checker"]

# What an exception says about a learner's answer, when the checker has no more precise hint: where it happened,
# not a guess at its cause (a checker names a cause only when the answer's outputs match it).
_HINTS = {
    ZeroDivisionError: "a division by zero: some divisor in your code is 0 for this input; if the statement's "
                       "formula is defined here, that divisor is not the one the formula has",
    IndexError: "an index out of range: check the loop bounds and the sizes you index with",
    KeyError: "a key that is not in the dict: check which keys you look up",
    TypeError: "an argument of the wrong type or number: print the types of what you pass "
               "(a tensor where a number is expected, or a tuple where a tensor is?)",
    RuntimeError: "PyTorch refused an operation, usually because the shapes or dtypes do not fit: "
                  "print the shapes and dtypes of your intermediate tensors",
    ValueError: "a value PyTorch or Python refused: check the sizes and arguments you pass",
    AttributeError: "an attribute that does not exist: check the type of the object you use",
}


def call(function: Callable, *args, on: str, hint: str | Callable[[Exception], str | None] | None = None,
         refuse: Sequence[Refuse] = (), keep_inputs: bool = True, **kwargs):
    """Call the learner's `function(*args, **kwargs)` for a checker and return what it returns.

    An exception raised inside it becomes an AssertionError that says which exception, on which input
    (`on`: a clause, "the candidate is empty (c=0)", or the arguments, "x of shape (2, 3)", which the
    message puts after "when given"), and what it usually means: `hint` (a text, or a function of the
    exception that returns one or None), else a generic hint for its type; the learner's exception stays
    attached (`__cause__`) with their frames only. NotImplementedError (the unfilled stub) and an
    AssertionError raised in a checker module (a refusal, a message from a function the checker handed
    over) pass through unchanged; a failed `assert` of the learner's own is named like any exception.
    While it runs, each call named in `refuse` raises its message; with `keep_inputs`, an argument it
    changed in place (tensor, list, a module's weights) is named.
    """
    before = ([snapshot(value) for value in args], {key: snapshot(value) for key, value in kwargs.items()}) if keep_inputs else None
    name = getattr(function, "__name__", None) or type(function).__name__
    try:
        with refusing(refuse):
            result = function(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as error:
        if isinstance(error, AssertionError) and _raised_by_a_checker(error):
            raise                                       # a refusal or another checker's message
        text = hint(error) if callable(hint) else hint
        if not text:
            text = ("an assert in your own code failed: read its message" if isinstance(error, AssertionError) else
                    next((h for kind, h in _HINTS.items() if isinstance(error, kind)), "read the traceback above"))
        first = on.split(" ", 1)[0]
        when = "when" if first.endswith("ing") or first == "the" else "when given"
        error.__traceback__ = error.__traceback__.tb_next   # from the learner's function on, not the checker's frame
        raise AssertionError(f"your {name} raised {type(error).__name__} ({error}) {when} {on}: {text}") from error
    changed = first_change(function, before, args, kwargs) if keep_inputs else None
    if changed is not None:
        raise AssertionError(f"your {name} changed its input `{changed}` in place (given {on}): leave the inputs "
                             "as they are and compute on new tensors or lists (y = x + ..., not x += ..., "
                             "x[...] = ... or list.append on an argument; .clone() or list(...) first)")
    return result


_HERE = os.path.dirname(os.path.abspath(__file__))


def _raised_by_a_checker(error: BaseException) -> bool:
    """True when the innermost frame of `error`'s traceback is in a checker module (a refusal, a checker's
    message from a function it handed the learner), False when it is the learner's own code."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.dirname(os.path.abspath(tb.tb_frame.f_code.co_filename)) == _HERE


def _say_what_is_wrong(message: AssertionError):
    raise message                                         # what is wrong with your answer: the message below


def run_checker(exercise: str, your_function: Callable, check: Callable[[Callable], None]) -> None:
    """Run `check(your_function)`; print "correct" or "not attempted yet", or raise the AssertionError that says
    what is wrong, without the checker's frames (IPython and pytest hide this one and the public `check_…`,
    `__tracebackhide__`: a notebook shows the learner's cell, their own frames, and the message)."""
    __tracebackhide__ = True
    if not callable(your_function):
        raise TypeError(f"{exercise}: pass your function itself (no parentheses), "
                        f"got {type(your_function).__name__}")
    python_state = random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):           # the learner's global random state stays as it was
            check(your_function)
    except AssertionError as wrong:
        _say_what_is_wrong(wrong.with_traceback(None))    # without the checker's frames; the learner's stay in __cause__
    except NotImplementedError:
        print(f"{exercise}: not attempted yet. Replace the `raise NotImplementedError` in "
              f"`{getattr(your_function, '__name__', 'your function')}` with your code, then run this cell again.")
        return
    finally:
        random.setstate(python_state)
    print(f"correct: {exercise}")
