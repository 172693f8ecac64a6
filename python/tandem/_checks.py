"""Argument checks the package's front ends share: a bad value is named with what was expected,
never compared, truncated or passed on to fail somewhere else."""
import math
import numbers


def whole(name: str, value, minimum: int) -> int:
    """`value` as an int when it is a whole number >= minimum (an int, or numpy's), else a
    TypeError / ValueError naming the argument: "8", 8.5 and True are not batch sizes."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} {value!r} is a {type(value).__name__}: expected a whole "
                        f"number >= {minimum}")
    if value < minimum:
        raise ValueError(f"{name} {value} is not valid: expected >= {minimum}")
    return int(value)


def rank_shard(samples: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """A rank's share of `samples` (DistributedSampler's: every world_size-th), or ValueError when
    dropping the last partial batch would leave no batch at all: every pass would be empty."""
    shard = math.ceil(samples / world_size)
    if shard < batch_size and drop_last:
        per_rank = f" ({shard} for each of {world_size} ranks)" if world_size > 1 else ""
        raise ValueError(f"the dataset has {samples} samples{per_rank}, fewer than one batch of "
                         f"{batch_size}: expected a smaller batch_size or drop_last=False")
    return shard
