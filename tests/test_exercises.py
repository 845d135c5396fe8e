"""Every exercise checker, found in transformer_lib.exercises, is wired up both ways: a learner's
unfilled stub is "not attempted yet" (never "correct", never a crash of Run all), some notebook asks
the learner to call it, its solution passes it, and its own test file feeds it a wrong answer."""
import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import pytest

import transformer_lib.exercises as exercises

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

    assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    assert f"{name}(" in code_of("notebooks"), f"no notebook asks the learner to call {name}"
    assert f"{name}(" in code_of("solutions"), f"no solution runs {name}"
    own_tests = (ROOT / "tests" / f"test_exercises_{module}.py").read_text(encoding="utf-8")
    assert name in own_tests and "pytest.raises(AssertionError" in own_tests, \
        f"tests/test_exercises_{module}.py must show {name} rejecting a wrong answer"
