"""The scalar options both fronts take (flexcp.attention, a DistAttention call) as the C++ side
reads them, refused with the function, the argument and what was expected when they are not."""
import numbers


def real_number(fn: str, name: str, x) -> float:
    # bool is a number to Python but never a scale or a cap a user meant.
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"{fn}: {name} must be a real number, got {type(x).__name__}")
    return float(x)


def scale_option(fn: str, scale) -> float:
    """None -> 0, which the C++ options read as 1/sqrt(D); so a scale of 0 given here (uniform
    weights over the attended keys) is refused rather than silently replaced."""
    if scale is None:
        return 0.0
    value = real_number(fn, "scale", scale)
    if value == 0.0:
        raise ValueError(f"{fn}: scale is 0, expected a nonzero number (None for 1/sqrt(D))")
    return value
