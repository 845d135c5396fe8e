"""Checkers for the coding exercises of notebook 14 (scaling out): `check_…(your_function)`.

Hand-written, not exported (see `transformer_lib.exercises`). `check_shard` compares the learner's
function with `transformer_lib.distributed.shard_batches`. `check_ring_allreduce` runs the learner's
per-rank function in one thread per rank on a simulated ring network that records every message, so it
checks the algorithm, not only the sum (`transformer_lib.exercises.ring`).
"""
from transformer_lib.distributed import shard_batches
from transformer_lib.exercises import Refuse, call, fresh_random, run_checker
from transformer_lib.exercises.explain import what_it_is
from transformer_lib.exercises.ring import ring_checks

_NO_SHARD_BATCHES = [Refuse(shard_batches, "shard_batches is the course's own function, the one this exercise asks "
                            "you to write")]


def check_shard(your_function) -> None:
    """`your_function(batches, rank, world_size)` -> the batches rank `rank` trains on this epoch."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    def _check(fn):
        rng = fresh_random()
        world = rng.randint(2, 6)
        drawn = (rng.randint(world + 1, 40), world)
        for n_batches, world_size in ((8, 2), (7, 2), (10, 3), (11, 4), (4, 4), (5, 1), (2, 3), (0, 2), drawn):
            batches = [f"b{i}" for i in range(n_batches)]
            try:
                returned = [call(fn, batches, rank, world_size, refuse=_NO_SHARD_BATCHES,
                                 on=f"{n_batches} batches, rank={rank}, world_size={world_size}"
                                    + (" (fewer batches than ranks)" if n_batches < world_size else ""))
                            for rank in range(world_size)]
            except AssertionError as error:
                if n_batches < world_size and isinstance(error.__cause__, ValueError):
                    continue                   # a ValueError is right too (shard_batches raises one)
                raise
            odd = next((shard for shard in returned if not isinstance(shard, list)), None)
            if odd is not None:
                raise AssertionError(f"{n_batches} batches, world_size {world_size}: return a list, as the statement "
                                     f"asks; you returned {what_it_is(odd)}" + (
                                         ", an iterator that is empty once read: wrap it in list(...)"
                                         if hasattr(odd, "__next__") else ": wrap it in list(...)"))
            shards = returned
            expected = [batches[rank:n_batches - n_batches % world_size:world_size] for rank in range(world_size)]
            if shards == expected:
                continue
            if sorted(map(tuple, shards)) == sorted(map(tuple, expected)) and len(set(map(tuple, expected))) > 1:
                owner = [expected.index(shard) for shard in shards]
                raise AssertionError(f"{n_batches} batches, world_size {world_size}: each rank got another rank's "
                                     f"share (rank r got the share of rank {owner} for r = 0 .. {world_size - 1}): "
                                     "ranks count from 0, and rank r starts at batch r: "
                                     "batches[rank:len(batches) - len(batches) % N:N]")
            sizes = [len(shard) for shard in shards]
            per_rank = n_batches // world_size
            if len(set(sizes)) == 1 and sizes[0] != per_rank and all(
                    shard == batches[rank::world_size][:sizes[0]] for rank, shard in enumerate(shards)):
                usual = {per_rank - 1: "one too few", per_rank + 1: "one too many"}.get(sizes[0])
                if sizes[0] == (n_batches - 1) // world_size:
                    usual = ("one too few; (len(batches) − 1) // world_size gives that when world_size divides "
                             "len(batches)")
                raise AssertionError(f"{n_batches} batches over {world_size} ranks: every rank got the right batches "
                                     f"in the right order, but {sizes[0]} of them where len(batches) // world_size = "
                                     f"{per_rank} is expected" + (f" ({usual})" if usual else "") + ": only the last "
                                     "len(batches) % world_size batches are dropped")
            if len(set(sizes)) > 1:
                rest = n_batches % world_size
                raise AssertionError(f"{n_batches} batches over {world_size} ranks gave shards of {sizes} batches: "
                                     "every rank must get the same number, or the rank with one more waits in the "
                                     "all-reduce until the process group's timeout (30 min for gloo, 10 for NCCL); " + (f"drop the last {rest} first" if rest else
                                     "rank r takes batches r, r + N, r + 2N, ... (batches[rank::world_size])"))
            used = [b for shard in shards for b in shard]
            if len(set(used)) < len(used):
                raise AssertionError("a batch went to two ranks: the shards must be disjoint")
            rest = n_batches % world_size
            if rest and shards == [batches[rest:][r::world_size] for r in range(world_size)]:
                raise AssertionError(f"{n_batches} batches over {world_size} ranks: you dropped the FIRST {rest} "
                                     "batches; drop the last ones, so that update k still uses batches kN ... "
                                     "kN + N − 1: batches[rank:len(batches) - len(batches) % N:N]")
            usable = n_batches - n_batches % world_size
            blocks = [batches[r * usable // world_size:(r + 1) * usable // world_size] for r in range(world_size)]
            if shards == blocks:
                raise AssertionError("you gave each rank a contiguous block; interleave instead (rank r takes "
                                     "batches r, r + N, r + 2N, ...), so that update k uses batches kN ... kN + N − 1, "
                                     "the ones one process with accumulate = N uses")
            raise AssertionError(f"{n_batches} batches, world_size {world_size}: rank 0 got {shards[0]}, "
                                 f"expected {expected[0]}")
    run_checker("sharding an epoch's batches", your_function, _check)


def check_ring_allreduce(your_function) -> None:
    """`your_function(tensor, rank, world_size, send, recv)`, run once per rank: returns the sum over the
    ranks' tensors, computed by a ring (2(N − 1) messages per rank, each one chunk of the tensor)."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("ring all-reduce", your_function, ring_checks)
