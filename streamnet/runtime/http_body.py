"""Reading an HTTP reply's body on aiohttp, bounded.

`StreamReader.read(n)` returns what is buffered, up to n bytes, not the body to its
end: a worker's /status or /hello that came in more than one piece (a few KB over a
network, ~128 KB on loopback) was cut there and read as malformed JSON.
"""
from __future__ import annotations

import aiohttp


async def read_bounded(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body to its end, or its first limit + 1 bytes where it is longer (the
    caller refuses those: more than `limit`)."""
    chunks, size = [], 0
    while size <= limit:
        chunk = await content.read(limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
