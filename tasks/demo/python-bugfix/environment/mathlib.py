"""Tiny statistics helpers."""


def mean(values):
    """Arithmetic mean of a non-empty sequence of numbers."""
    if not values:
        raise ValueError("mean() of empty sequence")
    return sum(values) / len(values)


def median(values):
    """Middle value of a non-empty sequence of numbers.

    For an even number of values the median is the average of the
    two middle values.
    """
    if not values:
        raise ValueError("median() of empty sequence")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid]


def clamp(value, low, high):
    """Limit value to the closed interval [low, high]."""
    if low > high:
        raise ValueError("low must not exceed high")
    return max(low, min(value, high))
