"""The checkers of notebook 14's coding exercises: the unfilled stub is "not attempted yet",
plausible mistakes raise AssertionError with a message that says what is wrong, right answers (several
ways of writing them) pass. The ring all-reduce is checked as a ring: per-rank functions joined by a
simulated network that counts what each rank sends."""
import contextlib
import io
import pytest
import torch

from transformer_lib.distributed import shard_batches
from transformer_lib.exercises.distributed import check_ring_allreduce, check_shard


def accepted(check, answer) -> bool:
    """The checker printed "correct: ..." (and only that) and returned None."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = check(answer)
    return result is None and out.getvalue().startswith("correct: ") and out.getvalue().count("\n") == 1



def stub(*args):
    raise NotImplementedError


# ---------------------------------------------------------------- sharding
def test_shard_stub_is_not_attempted(capsys):
    assert check_shard(stub) is None
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize("right", [lambda b, r, n: b[r:len(b) - len(b) % n:n],
                                   lambda b, r, n: [x for i, x in enumerate(b[:len(b) // n * n]) if i % n == r]])
def test_shard_right_answers(right):
    assert accepted(check_shard, right)


def shard_loop(batches, rank, world_size):
    """Another right answer: a loop over the updates, each taking the rank's batch from a full group of N."""
    shard = []
    for start in range(0, len(batches) - world_size + 1, world_size):
        shard.append(batches[start + rank])
    return shard


def test_shard_more_right_answers():
    assert accepted(check_shard, shard_loop)


def shard_pops(batches, rank, world_size):
    while len(batches) % world_size:
        batches.pop()                                              # edits the caller's list
    return batches[rank::world_size]


@pytest.mark.parametrize("wrong, message", [
    (shard_batches, "shard_batches is the course's own function"),
    (lambda b, r, n: b[len(b) % n:][r::n], "dropped the FIRST"),
    (shard_pops, "changed its input `batches` in place"),
    (lambda b, r, n: b[r:len(b) - len(b) % n:n] if len(b) >= n else b[r:r + 1], "fewer batches than ranks|same number"),
])
def test_shard_more_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_shard(wrong)


def blocks(batches, rank, world_size):
    per_rank = len(batches) // world_size
    return batches[rank * per_rank:(rank + 1) * per_rank]


@pytest.mark.parametrize("wrong, message", [
    (lambda b, r, n: b[r::n], "same number.*drop the last 1"),              # the remainder kept
    (blocks, "contiguous block; interleave"),
    (lambda b, r, n: b[:len(b) - len(b) % n][:len(b) // n], "went to two ranks"),   # every rank the same batches
    (lambda b, r, n: b[(r + 1) % n:len(b) - len(b) % n:n] if n > 1 else b, "another rank's share.*ranks count from 0"),
    (lambda b, r, n: b[r::n][len(b) // n], "raised IndexError"),
])
def test_shard_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_shard(wrong)


# ---------------------------------------------------------------- ring all-reduce
def ring(tensor, rank, world_size, send, recv):
    n = world_size
    chunks = list(tensor.clone().tensor_split(n))
    for s in range(n - 1):                                   # reduce-scatter
        send(chunks[(rank - s) % n])
        c = (rank - 1 - s) % n
        chunks[c] = chunks[c] + recv()
    for s in range(n - 1):                                   # all-gather
        send(chunks[(rank + 1 - s) % n])
        chunks[(rank - s) % n] = recv()
    return torch.cat(chunks)


def ring_in_place(tensor, rank, world_size, send, recv):
    """Wrong here: views of the rank's own tensor, summed into in place as dist.all_reduce does; the exercise
    returns the sum and leaves the caller's tensor alone."""
    chunks = tensor.tensor_split(world_size)                 # views: writing them writes `tensor`
    for s in range(world_size - 1):
        send(chunks[(rank - s) % world_size])
        chunks[(rank - 1 - s) % world_size].add_(recv())
    for s in range(world_size - 1):
        send(chunks[(rank + 1 - s) % world_size])
        chunks[(rank - s) % world_size].copy_(recv())
    return tensor


def ring_other_schedule(tensor, rank, world_size, send, recv):
    """Another right answer: rank r starts by sending chunk r + 1 (a shifted but valid schedule), float32 inside."""
    n = world_size
    chunks = [c.float() for c in tensor.tensor_split(n)]
    for s in range(n - 1):
        send(chunks[(rank + 1 - s) % n])
        chunks[(rank - s) % n] += recv()
    for s in range(n - 1):
        send(chunks[(rank + 2 - s) % n])
        chunks[(rank + 1 - s) % n] = recv()
    return torch.cat(chunks).double()


def test_ring_stub_is_not_attempted(capsys):
    assert check_ring_allreduce(stub) is None
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize("right", [ring, ring_other_schedule])
def test_ring_right_answers(right):
    assert accepted(check_ring_allreduce, right)


def test_ring_writing_into_the_callers_tensor_is_named():
    with pytest.raises(AssertionError, match="your ring_in_place changed its input `tensor` in place"):
        check_ring_allreduce(ring_in_place)


def ring_variant(tensor, rank, world_size, send, recv, split=None, gather="overwrite", gather_steps=None,
                 add_to=lambda rank, s, n: (rank - 1 - s) % n, divide=False):
    n = world_size
    chunks = list((split or (lambda t, n: t.tensor_split(n)))(tensor.clone(), n))
    for s in range(n - 1):
        send(chunks[(rank - s) % n])
        c = add_to(rank, s, n)
        chunks[c] = chunks[c] + recv()
    for s in range(n - 1 if gather_steps is None else gather_steps):
        send(chunks[(rank + 1 - s) % n])
        c = (rank - s) % n
        chunks[c] = recv() if gather == "overwrite" else chunks[c] + recv()
    out = torch.cat(chunks)
    return out / n if divide else out


def sum_everywhere(tensor, rank, world_size, send, recv):
    """The issue's hole, as it can still be written: pass whole tensors around and add them up."""
    total, passing = tensor.clone(), tensor.clone()
    for _ in range(world_size - 1):
        send(passing)
        passing = recv()
        total = total + passing
    return total


def receive_first(tensor, rank, world_size, send, recv):
    chunks = list(tensor.clone().tensor_split(world_size))
    for s in range(world_size - 1):
        received = recv()                                     # every rank waits: nobody has sent yet
        send(chunks[(rank - s) % world_size])
        chunks[(rank - 1 - s) % world_size] += received
    return torch.cat(chunks)


def rank_zero_one_more_step(tensor, rank, world_size, send, recv):
    out = ring(tensor, rank, world_size, send, recv)
    if rank == 0 and world_size > 1:
        recv()                                                # waits for a message no rank sends
    return out


def sends_a_list(tensor, rank, world_size, send, recv):
    send(list(tensor.tensor_split(world_size)))
    return tensor


@pytest.mark.parametrize("wrong, message", [
    (sum_everywhere, "sent a message of 6 elements; a ring step sends ONE chunk"),
    (lambda *a: ring_variant(*a, split=lambda t, n: t.chunk(n)),
     "raised IndexError .* rank \\d of world_size=4 on a tensor of 3 elements: torch.chunk"),
    (lambda *a: ring_variant(*a, gather_steps=0), "only the reduce-scatter"),
    (lambda *a: ring_variant(*a, gather_steps=1), "rank 0 sent 3 messages; a ring all-reduce takes 2\\(N − 1\\) = 4 steps"),
    (lambda *a: ring_variant(*a, gather="add"), "OVERWRITES its copy"),
    (lambda *a: ring_variant(*a, add_to=lambda rank, s, n: (rank - s) % n), "sums the inputs of ranks"),
    (lambda *a: ring_variant(*a, divide=True), "returned the mean"),
    (receive_first, "deadlock, ranks \\[0, 1\\] wait in recv"),
    (rank_zero_one_more_step, "deadlock, ranks \\[0\\]"),
    (sends_a_list, "send\\(\\) takes one tensor"),
    (lambda tensor, rank, world_size, send, recv: ring(tensor, rank, world_size, send, recv).tolist(),
     "return this rank's result"),
    (lambda tensor, rank, world_size, send, recv: ring(tensor, rank, world_size, send, recv)[:-1],
     "return this rank's result"),
])
def test_ring_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_ring_allreduce(wrong)


def test_the_ring_counts_what_each_rank_sends():
    from transformer_lib.exercises.ring import _run_ring
    tensors = [torch.arange(10.0) * 10 ** r for r in range(4)]
    results, network = _run_ring(ring, tensors)
    for rank in range(4):
        torch.testing.assert_close(results[rank], sum(tensors))
        assert len(network.sent[rank]) == 2 * (4 - 1)                # 2(N − 1) messages
        assert all(size in (2, 3) for size in network.sent[rank])   # each one chunk: tensor_split(10, 4) = 3, 3, 2, 2


# ---------------------------------------------------------------- fresh4: the number of batches per rank
@pytest.mark.parametrize("per_rank, message", [
    (lambda n, world_size: (n - 1) // world_size, r"3 of them where .* = 4 is expected \(one too few; \(len"),
    (lambda n, world_size: n // world_size - 1, r"3 of them where .* = 4 is expected \(one too few"),
])
def test_shard_with_a_wrong_count_per_rank_is_named(per_rank, message):
    def shard(batches, rank, world_size):
        return [batches[k * world_size + rank] for k in range(per_rank(len(batches), world_size))]

    with pytest.raises(AssertionError, match="every rank got the right batches in the right order, but " + message):
        check_shard(shard)
