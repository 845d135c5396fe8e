"""Checkers for the coding exercises of notebook 14 (scaling out): `check_…(your_function)`.

Hand-written, not exported (see `transformer_lib.exercises`). Each checker runs the learner's
function on small inputs and compares it with `transformer_lib.distributed.shard_batches` or with
the plain sum that an all-reduce must give.
"""
import torch

from transformer_lib.distributed import shard_batches
from transformer_lib.exercises import run_checker


def check_shard(your_function) -> bool:
    """`your_function(batches, rank, world_size)` -> the batches rank `rank` trains on this epoch."""
    def _check(fn):
        for n_batches, world_size in ((8, 2), (7, 2), (10, 3), (4, 4), (5, 1)):
            batches = [f"b{i}" for i in range(n_batches)]
            shards = [list(fn(list(batches), rank, world_size)) for rank in range(world_size)]
            expected = [shard_batches(batches, rank, world_size) for rank in range(world_size)]
            if shards == expected:
                continue
            sizes = [len(shard) for shard in shards]
            if len(set(sizes)) > 1:
                raise AssertionError(f"{n_batches} batches over {world_size} ranks gave shards of {sizes} batches: "
                                     "every rank must get the same number, or the rank with one more waits forever "
                                     f"in the all-reduce; drop the last {n_batches % world_size} first")
            used = [b for shard in shards for b in shard]
            if len(set(used)) < len(used):
                raise AssertionError("a batch went to two ranks: the shards must be disjoint")
            usable = n_batches - n_batches % world_size
            blocks = [batches[r * usable // world_size:(r + 1) * usable // world_size] for r in range(world_size)]
            if shards == blocks:
                raise AssertionError("you gave each rank a contiguous block; interleave instead (rank r takes "
                                     "batches r, r + N, r + 2N, ...), so that update k uses batches kN ... kN + N − 1, "
                                     "the ones one process with accumulate = N uses")
            raise AssertionError(f"{n_batches} batches, world_size {world_size}: rank 0 got {shards[0]}, "
                                 f"expected {expected[0]}")
    return run_checker("sharding an epoch's batches", your_function, _check)


def check_ring_allreduce(your_function) -> bool:
    """`your_function(tensors)`: one 1-d tensor per rank in, each rank's result out: all equal the sum."""
    def _check(fn):
        generator = torch.Generator().manual_seed(0)
        for world_size, length in ((2, 6), (3, 7), (4, 10), (4, 3), (1, 5)):
            tensors = [torch.randn(length, generator=generator, dtype=torch.float64) for _ in range(world_size)]
            copies = [t.clone() for t in tensors]
            results = fn(tensors)
            for t, copy in zip(tensors, copies):
                assert torch.equal(t, copy), "your function changed its inputs: work on copies (t.clone())"
            assert isinstance(results, (list, tuple)) and len(results) == world_size, \
                f"return one tensor per rank ({world_size}), got {type(results).__name__}"
            total = torch.stack(tensors).sum(0)
            for rank, result in enumerate(results):
                assert torch.is_tensor(result) and result.shape == total.shape, \
                    f"rank {rank}: expected a tensor of shape {tuple(total.shape)}, got {getattr(result, 'shape', result)}"
                if world_size > 1 and torch.allclose(result, total / world_size):
                    raise AssertionError("you returned the mean; an all-reduce SUMs (DDP divides by the number of "
                                         "ranks itself, once)")
                head = length // world_size * world_size       # what equal chunks of length // world_size cover
                if length % world_size and torch.allclose(result[:head], total[:head]) \
                        and not torch.allclose(result, total):
                    raise AssertionError(f"the last {length % world_size} element(s) are wrong when {length} is not a "
                                         f"multiple of {world_size}: split with torch.tensor_split, which keeps them")
                torch.testing.assert_close(result, total, msg=lambda m: f"world_size {world_size}, rank {rank}: "
                                           f"not the sum of the ranks' tensors. {m}")
    return run_checker("ring all-reduce", your_function, _check)
