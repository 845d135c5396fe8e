"""The checkers of notebook 03's exercises: plausible slips -> a clear error, right -> True.
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import math

import pytest
import torch
from torch import nn

from transformer_lib.exercises.positional import check_learned_positions, check_loop_table


def loop_table(max_len, d_model, first=math.sin, second=math.cos, exponent=lambda i: 2 * i, start=0):
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = (pos + start) / 10000 ** (exponent(i) / d_model)
            table[pos, 2 * i], table[pos, 2 * i + 1] = first(angle), second(angle)
    return table


@pytest.mark.parametrize("wrong, message", [
    (lambda m, d: loop_table(m, d, first=math.cos, second=math.sin), "swapped"),
    (lambda m, d: loop_table(m, d, exponent=lambda i: i), "2i / d_model"),
    (lambda m, d: loop_table(m, d, start=1), "positions start at 0"),
    (lambda m, d: loop_table(m, d)[:, :-1], "shape"),
])
def test_loop_table_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_loop_table(wrong)


def test_loop_table_right_answer(capsys):
    assert check_loop_table(loop_table) is True
    assert "correct" in capsys.readouterr().out


class Learned(nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        return x + self.table(torch.arange(x.size(1)))


class PositionsOnly(Learned):
    def forward(self, x):
        return self.table(torch.arange(x.size(1))).expand_as(x)


class FrozenTable(nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        self.register_buffer("table", torch.randn(max_len, d_model))

    def forward(self, x):
        return x + self.table[: x.size(1)]


class ClampedPositions(Learned):
    def forward(self, x):  # "extrapolates" by reusing the last row: hides the problem
        positions = torch.arange(x.size(1)).clamp(max=self.table.num_embeddings - 1)
        return x + self.table(positions)


@pytest.mark.parametrize("wrong, message", [
    (PositionsOnly, "not the position vectors alone"),
    (FrozenTable, "buffer is not trained"),
    (ClampedPositions, "must raise an error"),
])
def test_learned_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_learned_positions(wrong)


def test_learned_right_answer(capsys):
    assert check_learned_positions(Learned) is True
    assert "correct" in capsys.readouterr().out
