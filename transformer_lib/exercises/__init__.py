"""Checkers for the course's coding exercises: `check_…(your_function)`, one module per notebook.

Hand-written, not exported: the checkers are not part of the Transformer, and they ship with the
package so that a learner on Colab or with a downloaded notebook can call them. Each checker runs
the learner's function on small inputs and compares it with the course's own code or PyTorch's:

* a correct answer prints "correct: …" and returns True;
* an exercise not attempted yet (the stub still raises NotImplementedError) prints what to do and
  returns False, so that "Run all" goes on to the end of the notebook;
* a wrong answer raises AssertionError with a message that says what is wrong.

The solutions are in `solutions/NN_*.ipynb` of the repository, apart from the notebooks.
"""
from collections.abc import Callable


def run_checker(exercise: str, your_function: Callable, check: Callable[[Callable], None]) -> bool:
    """Run `check(your_function)`; report "correct", "not attempted", or let AssertionError through."""
    if not callable(your_function):
        raise TypeError(f"{exercise}: pass your function itself (no parentheses), "
                        f"got {type(your_function).__name__}")
    try:
        check(your_function)
    except NotImplementedError:
        print(f"{exercise}: not attempted yet. Replace the `raise NotImplementedError` in "
              f"`{getattr(your_function, '__name__', 'your function')}` with your code, then run this cell again.")
        return False
    print(f"correct: {exercise}")
    return True
