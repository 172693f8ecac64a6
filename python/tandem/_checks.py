"""Argument checks the package's front ends share: a bad value is named with what was expected,
never compared, truncated or passed on to fail somewhere else."""
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
