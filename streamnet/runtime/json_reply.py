"""JSON replies of the worker's /status and the UI's API, whose numbers are finite.

Python's json writes a NaN or an infinity as the bare words NaN and Infinity, which
are not JSON: a browser's parser, the UI's own, refuses the whole reply. A run whose
loss diverged put one in its training figures, and every page of the UI that read
them failed. Such numbers go out as null, the UI's "no value".
"""
from __future__ import annotations

import json
import math

from aiohttp import web


def finite(value):
    """`value` with every non-finite float in it (in dicts, lists and tuples) as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _dumps(value) -> str:
    try:
        return json.dumps(value, allow_nan=False)     # the common case: one pass, nothing to replace
    except ValueError:
        return json.dumps(finite(value), allow_nan=False)


def json_reply(data, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=_dumps)
