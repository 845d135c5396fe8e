"""Every exercise checker, found in transformer_lib.exercises, is wired up both ways: a learner's
unfilled stub is "not attempted yet" (never "correct", never a crash of Run all), some notebook asks
the learner to call it, its solution passes it, and its own test file feeds it a wrong answer.
A checker prints only its message (it returns None, so a cell ending with it shows no stray True/False),
and an exception raised inside the learner's function comes back as an AssertionError naming it."""
import importlib
import math
import inspect
import json
import pkgutil
from pathlib import Path

import pytest

import transformer_lib.exercises as exercises
from transformer_lib.exercises import Refuse, call, run_checker
from transformer_lib.exercises.evaluation import check_brevity_penalty

ROOT = Path(__file__).resolve().parent.parent
CHECKERS = [(module.name, name, function)
            for module in pkgutil.iter_modules(exercises.__path__)
            for name, function in inspect.getmembers(importlib.import_module(f"{exercises.__name__}.{module.name}"),
                                                     inspect.isfunction)
            if name.startswith("check_") and function.__module__.endswith(module.name)]


def code_of(folder: str) -> str:
    return "\n".join("".join(cell["source"]) for path in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb"))
                     for cell in json.loads(path.read_text(encoding="utf-8"))["cells"] if cell["cell_type"] == "code")


def test_every_notebook_module_has_checkers():
    assert len({module for module, _, _ in CHECKERS}) == 14 and len(CHECKERS) >= 28


@pytest.mark.parametrize("module, name, check", CHECKERS, ids=[f"{m}.{n}" for m, n, _ in CHECKERS])
def test_checker_is_wired_up(module, name, check, capsys):
    def stub(*args, **kwargs):
        raise NotImplementedError  # your code here

    assert check(stub) is None
    out = capsys.readouterr().out
    assert "not attempted yet" in out and out.count("\n") == 1, out
    assert f"{name}(" in code_of("notebooks"), f"no notebook asks the learner to call {name}"
    assert f"{name}(" in code_of("solutions"), f"no solution runs {name}"
    own_tests = (ROOT / "tests" / f"test_exercises_{module}.py").read_text(encoding="utf-8")
    assert name in own_tests and "pytest.raises(AssertionError" in own_tests, \
        f"tests/test_exercises_{module}.py must show {name} rejecting a wrong answer"


def test_an_exception_in_the_learners_function_is_named_with_its_input_and_a_hint():
    def brevity_penalty(c, r):
        return math.exp(1 - r / c)

    with pytest.raises(AssertionError, match=r"your brevity_penalty raised ZeroDivisionError \(.*\) when the "
                                             r"candidate is empty \(c=0, r=5\): return 0.0") as caught:
        call(brevity_penalty, 0, 5, on="the candidate is empty (c=0, r=5)", hint="return 0.0 before dividing by c")
    assert isinstance(caught.value.__cause__, ZeroDivisionError)      # the learner's traceback stays attached


@pytest.mark.parametrize("error, hint", [(ZeroDivisionError, "division by zero"), (IndexError, "out of range"),
                                         (RuntimeError, "shapes"), (KeyError, "not in the dict")])
def test_exceptions_without_a_precise_hint_get_one_for_their_type(error, hint):
    def answer():
        raise error("boom")

    with pytest.raises(AssertionError, match=f"your answer raised {error.__name__}.*when given x of shape "
                                             f"\\(2, 3\\): .*{hint}"):
        call(answer, on="x of shape (2, 3)")


def test_the_stub_and_the_checkers_own_messages_pass_through_call():
    def stub():
        raise NotImplementedError

    def refused():
        return math.sqrt(4.0)

    def own_assert(x):
        assert x > 0, "x must be positive"
        return x

    with pytest.raises(NotImplementedError):
        call(stub, on="x")
    with pytest.raises(AssertionError, match="^a checker's message$"):      # raised in guards.py: passes through
        call(refused, on="x", refuse=[Refuse(math.sqrt, "a checker's message")])
    with pytest.raises(AssertionError, match=r"(?s)your own_assert raised AssertionError \(x must be positive.*\) "
                                             r"when given x=-1: an assert in your own code failed"):
        call(own_assert, -1, on="x=-1")


def test_a_learners_exception_keeps_their_frames_and_a_wrong_answer_drops_the_checkers():
    def brevity_penalty(c, r):
        return 1.0 if c >= r else math.exp(1 - r / c)

    with pytest.raises(AssertionError, match="raised ZeroDivisionError") as caught:
        check_brevity_penalty(brevity_penalty)

    def frames(error):
        names, tb = [], error.__traceback__
        while tb is not None:
            names.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        return names

    assert frames(caught.value)[1:] == ["check_brevity_penalty", "run_checker", "_say_what_is_wrong"]  # not _check_bp
    assert frames(caught.value.__cause__) == ["brevity_penalty"]   # the learner's frame only, no checker's


def test_a_bug_in_the_checker_itself_is_not_blamed_on_the_learner():
    def buggy_check(your_function):
        your_function()
        raise KeyError("the checker's own bug")

    with pytest.raises(KeyError, match="the checker's own bug"):
        run_checker("demo", lambda: None, buggy_check)


def test_a_correct_answer_prints_one_line_and_returns_none(capsys):
    assert run_checker("demo", lambda: None, lambda f: f()) is None
    assert capsys.readouterr().out == "correct: demo\n"
