"""Fencing: at most one live instance of a task acts on its state and its tuples.

Each new instance of a task claims its saved state with a versioned write, and
every save is compare-and-set on that version; an older instance (on a worker
that was paused or cut off and came back) fails its next save with FencedError
and stops without acking or publishing.
"""
from __future__ import annotations


class FencedError(Exception):
    """This task instance was superseded by another (its state was claimed since)."""
