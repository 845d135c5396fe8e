"""The checkers of notebook 03's exercises: plausible slips -> a clear error, right answers (several
ways of writing them) -> "correct".
(Every checker's unfilled stub is tested in tests/test_exercises.py.)"""
import contextlib
import io
import math

import pytest
import torch
from torch import nn

from transformer_lib.exercises.positional import check_learned_positions, check_loop_table


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



def loop_table(max_len, d_model, first=math.sin, second=math.cos, exponent=lambda i: 2 * i, start=0):
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = (pos + start) / 10000 ** (exponent(i) / d_model)
            table[pos, 2 * i], table[pos, 2 * i + 1] = first(angle), second(angle)
    return table


def by_column(max_len, d_model, odd_exponent=lambda j: j - 1):
    """Loop over columns j: sin for even j, cos for odd j with the exponent of column j - 1 (right)."""
    rows = []
    for pos in range(max_len):
        rows.append([math.sin(pos / 10000 ** (j / d_model)) if j % 2 == 0 else
                     math.cos(pos / 10000 ** (odd_exponent(j) / d_model)) for j in range(d_model)])
    return torch.tensor(rows, dtype=torch.float64)                   # from nested lists


def concatenated(max_len, d_model):
    table = loop_table(max_len, d_model)
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)


def multiplied(max_len, d_model):
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos * 10000 ** (2 * i / d_model)
            table[pos, 2 * i], table[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return table


def loop_table_numpy_style(max_len, d_model):
    """Another right answer: the exponent written as exp(-2i ln(10000) / d_model), columns stepped by 2."""
    table = torch.zeros(max_len, d_model).double()
    for pos in range(max_len):
        for i in range(0, d_model, 2):
            angle = pos * math.exp(-i * math.log(10000.0) / d_model)
            table[pos, i] = math.sin(angle)
            table[pos, i + 1] = math.cos(angle)
    return table


@pytest.mark.parametrize("wrong, message", [
    (lambda m, d: loop_table(m, d, first=math.cos, second=math.sin), "swapped"),
    (lambda m, d: loop_table(m, d, exponent=lambda i: i), "2i / d_model"),
    (lambda m, d: loop_table(m, d, start=1), "positions start at 0"),
    (lambda m, d: loop_table(m, d)[:, :-1], "shape"),
    (lambda m, d: by_column(m, d, odd_exponent=lambda j: j), "SAME angle as column 2i"),
    (concatenated, "all sines come first"),
    (multiplied, "you multiplied pos by 10000"),
    (lambda m, d: loop_table(m, d).tolist(), "return a torch.Tensor"),
    (lambda m, d: loop_table(m, d) * 1.01, "1.01 times the right one"),
    (lambda m, d: loop_table(m, d + 1)[:, :d], "differs from sinusoidal_table"),
    (lambda m, d: loop_table(m, d).float(), "right values in torch.float32; the exercise asks for float64"),
])
def test_loop_table_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_loop_table(wrong)


@pytest.mark.parametrize("right", [loop_table, by_column, loop_table_numpy_style])
def test_loop_table_right_answers(right):
    assert accepted(check_loop_table, right)


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


class InPlace(Learned):
    def forward(self, x):
        x += self.table(torch.arange(x.size(1)))
        return x


class BatchAsLength(Learned):
    def forward(self, x):
        return x + self.table(torch.arange(x.size(0)))[:, None, :]


class SameRowEverywhere(Learned):
    def forward(self, x):
        return x + self.table(torch.zeros(x.size(1), dtype=torch.long))


class ParameterTable(nn.Module):
    """Another right answer: a bare nn.Parameter, sliced, and the learner's own error for long inputs."""

    def __init__(self, d_model, max_len):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(max_len, d_model).normal_(std=0.02))

    def forward(self, x):
        assert x.size(1) <= self.table.size(0), "sequence longer than max_len"
        return x + self.table[: x.size(1)]


@pytest.mark.parametrize("wrong, message", [
    (PositionsOnly, "not the position vectors alone"),
    (FrozenTable, "buffer is not trained"),
    (ClampedPositions, "must raise an error"),
    (InPlace, "changed its input `x` in place"),
    (BatchAsLength, "batch row b got table row b at every position"),
    (SameRowEverywhere, "positions 0 and 1 got the same vector"),
])
def test_learned_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_learned_positions(wrong)


@pytest.mark.parametrize("right", [Learned, ParameterTable])
def test_learned_right_answers(right):
    assert accepted(check_learned_positions, right)


class ZeroInit(Learned):
    """A right answer the statement allows: the table starts at zeros (training fills it)."""

    def __init__(self, d_model, max_len):
        super().__init__(d_model, max_len)
        nn.init.zeros_(self.table.weight)


class TransposedParameter(nn.Module):
    """Another right answer: the table stored as (d_model, max_len)."""

    def __init__(self, d_model, max_len):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(d_model, max_len))

    def forward(self, x):
        return x + self.table[:, torch.arange(x.size(1))].T


@pytest.mark.parametrize("right", [ZeroInit, TransposedParameter])
def test_learned_more_right_answers(right):
    assert accepted(check_learned_positions, right)


class FromOne(Learned):
    def forward(self, x):
        return x + self.table(torch.arange(1, x.size(1) + 1).clamp(max=self.table.num_embeddings - 1))


class HardWired(Learned):
    def forward(self, x):
        return x + self.table(torch.arange(7))                       # the fixed case's length


@pytest.mark.parametrize("wrong, message", [
    (FromOne, "position t got row t \\+ 1"),
    (HardWired, "RuntimeError"),
])
def test_learned_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_learned_positions(wrong)


def loop_table_columns_twice(max_len, d_model):
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for c in range(0, d_model, 2):
            angle = pos / 10000 ** (2 * c / d_model)
            table[pos, c], table[pos, c + 1] = math.sin(angle), math.cos(angle)
    return table


def loop_table_memorised(max_len, d_model):
    from transformer_lib.positional import sinusoidal_table
    return sinusoidal_table(max_len, d_model).double()


@pytest.mark.parametrize("wrong, message", [
    (loop_table_columns_twice, "counts pairs twice"),
    (loop_table_memorised, "sinusoidal_table is the course's own table"),
])
def test_loop_table_more_slips_are_named(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_loop_table(wrong)


# ---------------------------------------------------------------- fresh4: precedence and integer division
def table_with(angle):
    def loop_table(max_len, d_model):
        table = torch.zeros(max_len, d_model, dtype=torch.float64)
        for pos in range(max_len):
            for i in range(d_model // 2):
                table[pos, 2 * i] = math.sin(angle(pos, i, d_model))
                table[pos, 2 * i + 1] = math.cos(angle(pos, i, d_model))
        return table
    return loop_table


@pytest.mark.parametrize("angle, message", [
    (lambda pos, i, d: pos / 10000 ** 2 * i / d, r"pos / 10000 \*\* 2 \* i / d_model is \(pos / 10000²\)"),
    (lambda pos, i, d: pos / 10000 ** (2 * i // d), "exponent is 0 in every column.*integer division"),
    (lambda pos, i, d: pos / 10000 ** (2 * i) / d, "divides by d_model outside the power"),
    (lambda pos, i, d: (pos / 10000) ** (2 * i / d), r"raises pos too"),
])
def test_loop_table_precedence_slips_are_named(angle, message):
    with pytest.raises(AssertionError, match=message):
        check_loop_table(table_with(angle))


def test_loop_table_with_the_angle_written_out_passes():
    assert accepted(check_loop_table, table_with(lambda pos, i, d: pos / 10000 ** (2 * i / d)))


def test_learned_positions_along_the_batch_are_named_the_same_on_every_call():
    """fresh4: the message quoted assert_close's largest difference, a number of the random table's."""
    messages = set()
    for _ in range(2):
        with pytest.raises(AssertionError, match="batch row b got table row b at every position") as caught:
            check_learned_positions(BatchAsLength)
        messages.add(str(caught.value))
    assert len(messages) == 1


class DependsOnTheRow(Learned):
    def forward(self, x):
        return x + self.table(torch.arange(x.size(1))) + torch.arange(x.size(0))[:, None, None]


def test_learned_positions_that_depend_on_the_batch_row_say_where():
    with pytest.raises(AssertionError, match="must not depend on the sentence .* at position 0, batch row 1 got"):
        check_learned_positions(DependsOnTheRow)
