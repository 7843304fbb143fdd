"""Python values as the C++ side reads them (the attention options, mask lengths and slice
bounds), refused with the function, the argument and what was expected when they are not: never
rounded, truncated or replaced."""
import numbers
import operator


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


_INT64 = (-(1 << 63), (1 << 63) - 1)


def integer(fn: str, name: str, x) -> int:
    """An int (or a NumPy or torch integer, or a float with no fraction, as a float tensor's
    tolist() gives) that the C++ side's int64 holds; 4.5 is an error, not 4, and so is True
    (an int to Python, but never a length or a head count a user meant)."""
    if isinstance(x, bool):
        raise ValueError(f"{fn}: {name} is {x!r}, expected an integer")
    try:
        value = int(x) if isinstance(x, float) and x.is_integer() else operator.index(x)
    except TypeError:
        raise ValueError(f"{fn}: {name} is {x!r}, expected an integer") from None
    if not _INT64[0] <= value <= _INT64[1]:
        raise ValueError(f"{fn}: {name} is {value}, expected an integer within int64 "
                         f"({_INT64[0]} to {_INT64[1]})")
    return value


def integers(fn: str, name: str, values) -> list:
    """A sequence of integers (a list, a tuple, a 1-D integer or integral tensor) as ints."""
    items = values.tolist() if hasattr(values, "tolist") else values
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise ValueError(f"{fn}: {name} must be a sequence of integers, got {values!r}")
    return [integer(fn, f"{name}[{i}]", v) for i, v in enumerate(items)]
