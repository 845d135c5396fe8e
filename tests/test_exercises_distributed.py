"""The checkers of notebook 14's coding exercises: the unfilled stub is "not attempted yet",
plausible mistakes raise AssertionError with a message that says what is wrong, a right answer passes."""
import pytest
import torch

from transformer_lib.distributed import shard_batches
from transformer_lib.exercises.distributed import check_ring_allreduce, check_shard


def stub(*args):
    raise NotImplementedError


# ---------------------------------------------------------------- sharding
def test_shard_stub_is_not_attempted(capsys):
    assert check_shard(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_shard_right_answers(capsys):
    assert check_shard(shard_batches) is True
    assert check_shard(lambda b, r, n: b[r:len(b) - len(b) % n:n]) is True
    assert "correct: sharding an epoch's batches" in capsys.readouterr().out


def blocks(batches, rank, world_size):
    per_rank = len(batches) // world_size
    return batches[rank * per_rank:(rank + 1) * per_rank]


@pytest.mark.parametrize("wrong, message", [
    (lambda b, r, n: b[r::n], "same number.*drop the last 1"),              # the remainder kept
    (blocks, "contiguous block; interleave"),
    (lambda b, r, n: b[:len(b) - len(b) % n][:len(b) // n], "went to two ranks"),   # every rank the same batches
    (lambda b, r, n: b[(r + 1) % n:len(b) - len(b) % n:n] if n > 1 else b, "rank 0 got"),
])
def test_shard_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_shard(wrong)


# ---------------------------------------------------------------- ring all-reduce
def ring(tensors):
    n = len(tensors)
    chunks = [list(t.clone().tensor_split(n)) for t in tensors]
    for s in range(n - 1):
        sent = [chunks[r][(r - s) % n].clone() for r in range(n)]
        for r in range(n):
            c = (r - 1 - s) % n
            chunks[r][c] = chunks[r][c] + sent[(r - 1) % n]
    for s in range(n - 1):
        sent = [chunks[r][(r + 1 - s) % n].clone() for r in range(n)]
        for r in range(n):
            chunks[r][(r - s) % n] = sent[(r - 1) % n]
    return [torch.cat(c) for c in chunks]


def test_ring_stub_is_not_attempted(capsys):
    assert check_ring_allreduce(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_ring_right_answers(capsys):
    assert check_ring_allreduce(ring) is True
    assert check_ring_allreduce(lambda ts: [torch.stack(ts).sum(0) for _ in ts]) is True   # not a ring, but the sum
    assert "correct: ring all-reduce" in capsys.readouterr().out


def in_place(tensors):
    total = torch.stack(tensors).sum(0)
    for t in tensors:
        t.copy_(total)
    return tensors


def equal_chunks(tensors):
    """Chunks of len // N elements: the tail is lost when N does not divide the length."""
    n, length = len(tensors), tensors[0].numel()
    size = length // n
    out = torch.stack(tensors).sum(0)
    out[size * n:] = tensors[0][size * n:]
    return [out.clone() for _ in tensors]


@pytest.mark.parametrize("wrong, message", [
    (lambda ts: [torch.stack(ts).mean(0) for _ in ts], "returned the mean"),
    (in_place, "changed its inputs"),
    (equal_chunks, "last 1 element"),
    (lambda ts: [torch.stack(ts).sum(0)], "one tensor per rank"),
    (lambda ts: [t.clone() for t in ts], "not the sum"),
])
def test_ring_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_ring_allreduce(wrong)
