"""The checks behind notebook 14's ring all-reduce exercise (hand-written, not exported).

The public `check_ring_allreduce` lives in `transformer_lib.exercises.distributed`, one module per notebook. Here
the learner's per-rank function runs in one thread per rank, joined by a simulated ring network (`_Ring`) that
carries tensors from each rank to the next and records every message, so the check is of the algorithm, not only
the sum: 2(N − 1) messages per rank, each one chunk (1/N of the tensor), and the sum on every rank. A wrong ring
is named by the schedule index it gets wrong (`_ring_variant`), or by the first message that sums the wrong ranks.
"""
import math
import threading
import time
from collections import deque

import torch

from transformer_lib.exercises import call, fresh_random
from transformer_lib.exercises.explain import name_difference, name_slip
from transformer_lib.exercises.guards import allclose, assert_close, isclose


class _Abort(BaseException):
    """Ends a rank's thread when the ring has failed (a deadlock, or an error on another rank)."""


class _Ring:
    """N ranks in a ring: `send(rank, t)` queues a copy of t for rank + 1 and returns at once, as a
    buffered send does; `recv(rank)` waits for the next message from rank − 1. Records the size of
    every message; notices a deadlock (every rank still running waits in recv with nothing queued)."""

    def __init__(self, world_size: int, timeout_s: float = 30.0):
        self.world_size, self.deadline = world_size, time.monotonic() + timeout_s
        self.condition = threading.Condition()
        self.inbox = [deque() for _ in range(world_size)]
        self.sent = [[] for _ in range(world_size)]       # numel of each message, per sender
        self.log = [[] for _ in range(world_size)]        # a copy of each message, per sender
        self.received = [0] * world_size
        self.running, self.waiting, self.failure = world_size, set(), None

    def send(self, rank: int, tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise AssertionError(f"rank {rank}: send() takes one tensor (a chunk), got {type(tensor).__name__}")
        with self.condition:
            self.inbox[(rank + 1) % self.world_size].append(tensor.detach().clone())   # the wire copies
            self.sent[rank].append(tensor.numel())
            self.log[rank].append(self.inbox[(rank + 1) % self.world_size][-1])
            self.condition.notify_all()

    def recv(self, rank: int) -> torch.Tensor:
        with self.condition:
            while not self.inbox[rank]:
                if self.failure is not None:
                    raise _Abort
                self.waiting.add(rank)
                self._notice_deadlock()
                if time.monotonic() > self.deadline:
                    self.failure = "timeout"
                self.condition.wait(timeout=1.0)
                self.waiting.discard(rank)
            self.received[rank] += 1
            return self.inbox[rank].popleft()

    def finished(self, error: BaseException | None = None) -> None:
        with self.condition:
            self.running -= 1
            if error is not None and not isinstance(error, _Abort) and self.failure is None:
                self.failure = "error"
            self._notice_deadlock()
            self.condition.notify_all()

    def _notice_deadlock(self) -> None:
        if self.failure is None and self.waiting and len(self.waiting) == self.running \
                and not any(self.inbox[r] for r in self.waiting):
            self.failure = "deadlock"
            self.stuck = sorted(self.waiting)
            self.condition.notify_all()


def _ring_hint(error: Exception) -> str | None:
    if isinstance(error, RuntimeError) and "must match the size" in str(error):
        return ("a chunk you received does not fit the chunk you add it to: the schedule is off. In reduce-scatter "
                "step s, rank r sends chunk (r − s) mod N and adds what it receives to chunk (r − 1 − s) mod N, the "
                "one its left neighbour sent")
    if isinstance(error, (IndexError, ValueError)):
        return ("torch.chunk(t, N) returns FEWER than N chunks when N does not divide the length well (3 elements "
                "in 4 chunks gives 3 chunks); torch.tensor_split(t, N) always returns N, some possibly empty")
    return None


def _run_ring(fn, tensors: list[torch.Tensor]) -> tuple[list, _Ring]:
    """Run fn(tensor, rank, world_size, send, recv) for every rank, one thread each."""
    world_size, length = len(tensors), tensors[0].numel()
    ring = _Ring(world_size)
    results, errors = [None] * world_size, [None] * world_size

    def run(rank: int) -> None:
        def send(tensor):
            ring.send(rank, tensor)

        def recv():
            return ring.recv(rank)

        error = None
        try:
            results[rank] = call(fn, tensors[rank].clone(), rank, world_size, send, recv,
                                 on=f"running as rank {rank} of world_size={world_size} on a tensor of {length} "
                                    f"elements", hint=_ring_hint)
        except BaseException as caught:             # re-raised in the checker's thread below
            error = errors[rank] = caught
        ring.finished(error)

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    first = next((e for e in errors if e is not None and not isinstance(e, _Abort)), None)
    if first is not None:
        raise first
    if ring.failure == "deadlock":
        counts = ", ".join(f"rank {r} sent {len(ring.sent[r])} and received {ring.received[r]}"
                           for r in range(world_size))
        raise AssertionError(f"world_size={world_size}: deadlock, ranks {ring.stuck} wait in recv() for a message "
                             f"that no rank will send ({counts}). In every step each rank sends first, then "
                             "receives (send does not wait), and all ranks run the same number of steps")
    if ring.failure is not None or any(thread.is_alive() for thread in threads):
        raise AssertionError(f"world_size={world_size}: the ranks did not finish within 30 s")
    return results, ring


def _contributions(value: float, world_size: int) -> dict[int, float]:
    """Rank r's input is 10^r everywhere: read back how many times each rank's input was added."""
    counts, rest = {}, round(value)
    for rank in range(world_size):
        rest, digit = divmod(rest, 10)
        if digit:
            counts[rank] = digit
    return counts


def _ring_variant(tensors: list[torch.Tensor], rs_send: int = 0, rs_add: int = -1, ag_send: int = 1, ag_recv: int = 0,
                  scatter: str = "add", gather: str = "overwrite") -> list[torch.Tensor]:
    """The reference ring, every rank in lockstep, each index of its schedule a knob (an offset from the right one);
    returns every rank's result and the messages each rank sent (two schedules can give the same results but not
    the same messages):
    reduce-scatter step s, rank r sends chunk (r + rs_send − s) mod N and adds (`scatter`) what it receives to chunk
    (r + rs_add − s) mod N; all-gather step s, it sends chunk (r + ag_send − s) and writes (`gather`) into (r + ag_recv − s)."""
    n = len(tensors)
    chunks = [list(t.clone().tensor_split(n)) for t in tensors]
    log = [[] for _ in range(n)]                                     # what each rank sent, in order
    for send, into, how in ((rs_send, rs_add, scatter), (ag_send, ag_recv, gather)):
        for s in range(n - 1):
            messages = [chunks[r][(r + send - s) % n] for r in range(n)]
            for r in range(n):
                log[r].append(messages[r])
                c, received = (r + into - s) % n, messages[(r - 1) % n]
                chunks[r][c] = received.clone() if how == "overwrite" else chunks[r][c] + received
    return [torch.cat(rank_chunks) for rank_chunks in chunks], log


def _ring_slips() -> dict[str, dict]:
    rule_scatter = ("In reduce-scatter step s, rank r sends chunk (r − s) mod N and adds what it receives to chunk "
                    "(r − 1 − s) mod N, the one its left neighbour sent")
    rule_gather = ("After the reduce-scatter rank r holds the full sum of chunk (r + 1) mod N; in all-gather step s it "
                   "sends chunk (r + 1 − s) mod N, the finished one, and overwrites chunk (r − s) mod N with what it "
                   "receives")
    slips = {}
    for k, sent, added, gathered in ((-1, "r − 1 − s", "r − 2 − s", "r − s"), (1, "r + 1 − s", "r − s", "r + 2 − s")):
        slips[f"in the reduce-scatter, rank r sends chunk ({sent}) mod N, one step off. {rule_scatter}"] = {"rs_send": k}
        slips[f"in the reduce-scatter, rank r adds what it receives to chunk ({added}) mod N, not to the one its left "
              f"neighbour sent. {rule_scatter}"] = {"rs_add": -1 + k}
        slips[f"in the all-gather, rank r sends chunk ({gathered}) mod N, not the finished one it holds (or has just "
              f"received). {rule_gather}"] = {"ag_send": 1 + k}
        slips[f"in the all-gather, rank r writes what it receives into chunk ({sent}) mod N, not into the one its left "
              f"neighbour sent. {rule_gather}"] = {"ag_recv": k}
    slips["in the all-gather the receiver OVERWRITES its copy of the finished chunk, it does not add to it"] = \
        {"gather": "add"}
    slips["in the reduce-scatter the receiver ADDS what it receives to its own chunk; you overwrote the chunk, which "
          f"loses this rank's share. {rule_scatter}"] = {"scatter": "overwrite"}
    return slips


def _name_ring_slip(fn, tensors: list[torch.Tensor], results: list, ring_log: list,
                    generator: torch.Generator) -> str | None:
    """The slip of the schedule that gives the learner's results on this case and on random ones of other sizes
    (random values: every chunk differs from the others, so a wrong chunk index shows)."""
    cases = [tensors] + [[torch.randn(k, generator=generator, dtype=torch.float64) for _ in range(m)]
                         for m, k in ((3, 9), (4, 8), (5, 10), (3, 7))]
    outputs = [(results, ring_log)] + _ring_outputs(fn, cases[1:])

    def variant(case, **knobs):
        try:
            return _ring_variant(case, **knobs)
        except RuntimeError:                         # chunks of other sizes added: the learner's ring fails too
            return None
    return name_slip(outputs, cases, variant, _ring_slips(), _same_results, pairs=False)


def _ring_outputs(fn, cases: list[list[torch.Tensor]]) -> list:
    """The learner's results and messages on each case (None where the ring failed or raised)."""
    outputs = []
    for tensors in cases:
        try:
            results, ring = _run_ring(fn, tensors)
            outputs.append((results, ring.log))
        except AssertionError:
            outputs.append(None)
    return outputs


def _same_results(got, wrong) -> bool:
    if got is None or wrong is None:
        return got is None and wrong is None

    def same(a, b) -> bool:
        return torch.is_tensor(a) and a.shape == b.shape and bool(allclose(a.double(), b.double()))
    (results, log), (wrong_results, wrong_log) = got, wrong
    return (len(results) == len(wrong_results) and all(map(same, results, wrong_results))
            and all(len(mine) == len(theirs) and all(map(same, mine, theirs)) for mine, theirs in zip(log, wrong_log)))


def _where_the_ring_goes_wrong(ring: _Ring, tensors: list[torch.Tensor], results: list) -> str:
    """With rank r's input 10^r everywhere, read which ranks each message sums: the first one that no valid
    schedule sends (step s of the reduce-scatter sums s + 1 ranks once each, the all-gather all N)."""
    n = len(tensors)
    for step in range(2 * (n - 1)):
        for rank in range(n):
            message = ring.log[rank][step]
            gather = step >= n - 1
            want = n if gather else step + 1
            for value in message.flatten().tolist():
                counts = _contributions(value, n)
                if sorted(counts.values()) != [1] * want:
                    phase = (f"all-gather step {step - n + 1}" if gather else f"reduce-scatter step {step}")
                    what = ("a finished chunk, the sum of all N ranks" if gather else
                            f"a partial sum of {want} ranks' inputs, each once")
                    before = " (the reduce-scatter before it was right)" if gather else ""
                    return (f"the first message that goes wrong is rank {rank}'s in {phase}{before}: it sums ranks "
                            f"{counts} (rank: times added), where every message of that step carries {what}")
    return ("every message the ranks sent is right, but the chunks are put together wrongly: each received chunk "
            "goes back to its own place, the one its sender took it from")


def ring_checks(fn) -> None:
    generator = torch.Generator().manual_seed(0)
    rng = fresh_random()
    for world_size, length in ((2, 6), (3, 7), (4, 10), (4, 3), (1, 5), (3, 8), (rng.randint(2, 5), rng.randint(1, 20))):
        chunk = math.ceil(length / world_size)
        for tagged in (True, False):
            if tagged:    # rank r holds 10^r in every element: a result tells whose inputs it sums
                tensors = [torch.full((length,), 10.0 ** r, dtype=torch.float64) for r in range(world_size)]
            else:
                tensors = [torch.randn(length, generator=generator, dtype=torch.float64) for _ in range(world_size)]
            where = f"world_size={world_size}, {length} elements"
            results, ring = _run_ring(fn, tensors)
            total = torch.stack(tensors).sum(0)
            for rank, result in enumerate(results):
                assert torch.is_tensor(result) and result.shape == total.shape, (
                    f"{where}: rank {rank} returned {getattr(result, 'shape', result)}; return this rank's result, "
                    f"a tensor of shape {tuple(total.shape)}")
            for rank in range(world_size):
                sizes = ring.sent[rank]
                if any(size > chunk for size in sizes):
                    raise AssertionError(
                        f"{where}: rank {rank} sent a message of {max(sizes)} elements; a ring step sends ONE chunk, "
                        f"1/N of the tensor (at most {chunk} elements here). Passing whole tensors costs every rank "
                        f"(N − 1)·L elements; the ring's reduce-scatter and all-gather cost 2(N − 1)·L/N")
                if len(sizes) != 2 * (world_size - 1):
                    half = " (that is only the reduce-scatter: the all-gather's N − 1 steps are missing)" \
                        if len(sizes) == world_size - 1 else ""
                    raise AssertionError(
                        f"{where}: rank {rank} sent {len(sizes)} messages{half}; a ring all-reduce takes "
                        f"2(N − 1) = {2 * (world_size - 1)} steps, N − 1 to reduce-scatter and N − 1 to all-gather, "
                        "one chunk sent and one received per step")
            unread = [r for r in range(world_size) if ring.inbox[r]]
            assert not unread, f"{where}: ranks {unread} never received some of the messages sent to them"
            for rank, result in enumerate(results):
                if allclose(result, total):
                    continue
                if world_size > 1 and allclose(result, total / world_size):
                    raise AssertionError("you returned the mean; an all-reduce SUMs (DDP divides by the number of "
                                         "ranks itself, once)")
                said = f"{where}, rank {rank}: not the sum of the ranks' tensors"
                if tagged:     # integers below 2^53: exact, but take an element that is wrong, not rounded
                    wrong = next(i for i in range(length) if not isclose(float(result[i]), float(total[i]),
                                                                         rel_tol=1e-9))
                    counts = _contributions(float(result[wrong]), world_size)
                    said = (f"{where}: element {wrong} of rank {rank} adds some ranks' inputs twice ({counts}, rank: "
                            "times added)" if any(count > 1 for count in counts.values()) else
                            f"{where}: element {wrong} of rank {rank} sums the inputs of ranks {sorted(counts)} only, "
                            f"not all {world_size}")
                slip = _name_ring_slip(fn, tensors, results, ring.log, generator)
                if slip:
                    raise AssertionError(f"{said}: {slip}")
                if tagged:
                    raise AssertionError(f"{said}; {_where_the_ring_goes_wrong(ring, tensors, results)}")
                name_difference(result, total, f"{where}, rank {rank}: ", "; every rank returns the sum of all ranks' tensors")
                assert_close(result, total, msg=lambda m: f"{where}, rank {rank}: not the sum of the "
                                           f"ranks' tensors. {m}")
