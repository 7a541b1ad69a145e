"""Checks of values read from outside (ZooKeeper nodes, frames, status replies, configs):
Python counts a bool as an int, which none of these fields mean."""
from __future__ import annotations


def whole(value) -> bool:
    """An integer field's check: an int, and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def real(value) -> bool:
    """A number field's check: an int or a float, and not a bool (NaN and inf pass: the
    caller bounds the value)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
