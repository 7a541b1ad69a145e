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
import http.client
import json
import os
import urllib.request

import aiohttp
from aiohttp import web

from ..errors import StreamnetError
from ..private_file import read_private
from .http_body import read_bounded
from .values import real, whole

MIN_TOKEN_CHARS = 16
ENV = "STREAMNET_MONITOR_TOKEN_FILE"
#: the most of a /status reply a reader takes: the address it asks comes from a worker's
#: record, and whoever answers there (a program that took a dead worker's port) is a stranger
MAX_STATUS_BYTES = 64 << 20


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


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """urllib follows a redirect with the request's headers, the token included, to
    wherever it points: a reader follows none (a redirect is an HTTPError)."""

    def redirect_request(self, *args, **kwargs):
        return None


def _status(body: bytes, url: str) -> dict:
    if len(body) > MAX_STATUS_BYTES:
        raise ValueError(f"{url}/status answered more than {MAX_STATUS_BYTES} bytes")
    try:
        status = json.loads(body)
    except RecursionError:
        raise ValueError(f"{url}/status answered JSON nested too deep") from None
    if not isinstance(status, dict):
        raise ValueError(f"{url}/status answered a JSON {type(status).__name__}, not an object")
    problem = _shape_problem(status)
    if problem:
        # another program on a dead worker's port, or another version: its reply broke the
        # UI's pages (KeyError), or killed its sampler for good (a task id not a number)
        raise ValueError(f"{url}/status is not a worker's status ({problem})")
    return status


def _shape_problem(status: dict) -> str | None:
    """What the readers index in a worker's status, checked (None: all there)."""
    threads, busy = status.get("threads"), status.get("busy_fraction")
    if not whole(threads):
        return f"threads {threads!r}"
    if not (busy is None or real(busy)):
        return f"busy_fraction {busy!r}"
    tops = status.get("topologies")
    if not isinstance(tops, dict):
        return "no topologies"
    for name, top in tops.items():
        tasks = top.get("tasks") if isinstance(top, dict) else None
        if not isinstance(tasks, dict):
            return f"topology {name!r} has no tasks"
        for task, m in tasks.items():
            if not (task.isdigit() and isinstance(m, dict) and isinstance(m.get("figures", []), list)
                    and all(isinstance(f, dict) and isinstance(f.get("labels"), dict) and "name" in f
                            and "value" in f for f in m.get("figures", []))):
                return f"topology {name!r}: task {task!r}"
    return None


def get_status(url: str, token: str | None, timeout: float = 3.0) -> dict:
    """A worker's /status at `url` (http://host:port), sending the token and following no
    redirect; OSError if it cannot be read, ValueError if it is not a status."""
    request = urllib.request.Request(url + "/status", headers=headers(token))
    try:
        with urllib.request.build_opener(_NoRedirects).open(request, timeout=timeout) as r:
            return _status(r.read(MAX_STATUS_BYTES + 1), url)
    except http.client.HTTPException as e:     # another program's answer (an SSH banner, say)
        raise ValueError(f"{url} did not answer HTTP: {type(e).__name__}: {e}") from None


async def fetch_status(session: aiohttp.ClientSession, url: str, token: str | None) -> dict:
    """get_status on an aiohttp session: aiohttp.ClientError or ValueError if it fails."""
    async with session.get(url + "/status", headers=headers(token), allow_redirects=False) as r:
        if r.status != 200:
            raise aiohttp.ClientResponseError(r.request_info, r.history, status=r.status, message=r.reason or "")
        return _status(await read_bounded(r.content, MAX_STATUS_BYTES), url)
