"""Names that become one element of a ZooKeeper path: a topology's name, a worker's id.

ZooKeeper refuses "." and "..", control characters and a few Unicode ranges in a path
element, and a "/" in a name would make a deeper path: created, parents and all, it
left a node that every later listing took for another worker (or topology)."""
from __future__ import annotations

import re

MAX_NAME = 200          # characters: a path element, not a document

# what ZooKeeper's PathUtils.validatePath refuses in a path element
_REFUSED = re.compile("[\u0000-\u001f\u007f-\u009f\ud800-\uf8ff\ufff0-\uffff/]")


def name_problem(name) -> str | None:
    """Why `name` cannot be a path element (None: it can)."""
    if not isinstance(name, str):
        return f"must be a string; got {name!r}"
    if not name or len(name) > MAX_NAME:
        return f"must be 1 to {MAX_NAME} characters; got {len(name)}"
    if name in (".", ".."):
        return f"cannot be {name!r}"
    bad = _REFUSED.search(name)
    if bad:
        return f"cannot hold {bad.group()!r}; got {name!r}"
    return None
