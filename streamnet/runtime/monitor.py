"""The monitor token: an optional bearer token for a worker's /status and /metrics.

Those two stay on the worker's port, where monitoring scrapes them, but they show
the leader, the placement and link errors; an operator who does not want that on
the network gives every worker (and every reader: Prometheus, streamnet-ui) the
same token file. Readers send it as Prometheus' `authorization` scrape setting
does:

    Authorization: Bearer <the file's content, stripped>

A request without it, or with another token, gets 401 and one line saying what to
send. The token file is held to the cluster secret's rules (mode 0600, owned by
the user) and must hold at least MIN_TOKEN_CHARS characters.
"""
from __future__ import annotations

import hmac
import os

from aiohttp import web

from ..errors import StreamnetError
from ..private_file import read_private

MIN_TOKEN_CHARS = 16
ENV = "STREAMNET_MONITOR_TOKEN_FILE"


def read_token(path: str) -> str:
    """The token in `path`; StreamnetError (naming the file and the fix) otherwise."""
    raw = read_private(path, "monitor token file")
    try:
        token = raw.decode("ascii")
    except UnicodeDecodeError:
        raise StreamnetError(f"monitor token file {path} must hold printable ASCII (it is sent in a header)") \
            from None
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or " " in token:
        raise StreamnetError(f"monitor token file {path} must hold one word of at least {MIN_TOKEN_CHARS} "
                             f"printable ASCII characters (e.g. `head -c 32 /dev/urandom | base64 > {path}`)")
    return token


def token_from_environment() -> str | None:
    """The token of $STREAMNET_MONITOR_TOKEN_FILE, or None if it is not set."""
    path = os.environ.get(ENV)
    return read_token(path) if path else None


def headers(token: str | None) -> dict[str, str]:
    """What a reader sends (nothing without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def refusal(request: web.Request, token: str | None) -> web.Response | None:
    """None if `request` may read (no token set, or the right one sent); else the 401."""
    if token is None:
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(errors="replace"), token.encode()):
        return None
    return web.Response(status=401, headers={"WWW-Authenticate": 'Bearer realm="streamnet"'},
                        text=f"401: {request.path} needs the monitor token: send 'Authorization: Bearer TOKEN' "
                             "with the worker's --monitor-token-file\n")
