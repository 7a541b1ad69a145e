"""Readers of a worker's /status (`streamnet-submit status`, the UI) take at most
MAX_STATUS_BYTES, only a JSON object, and follow no redirect: the address comes from
a worker's record, and whoever answers there could send the monitor token elsewhere
or a reply without end."""
import asyncio
import contextlib
import json
import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import pytest

from streamnet.runtime import monitor


@contextlib.contextmanager
def _server(reply):
    """An HTTP server on a free port answering every GET with reply(path) -> (status,
    headers, body); yields (its url, the Authorization headers it was sent)."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            status, headers, body = reply(self.path)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


async def _fetch(url):
    async with aiohttp.ClientSession() as s:
        return await monitor.fetch_status(s, url, "t" * 16)


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else():
    with _server(lambda path: (200, {}, b'{"worker": "w9"}')) as (elsewhere, seen_there):
        with _server(lambda path: (302, {"Location": elsewhere + "/status"}, b"")) as (url, seen_here):
            with pytest.raises(urllib.error.HTTPError):
                monitor.get_status(url, "t" * 16)
            with pytest.raises(aiohttp.ClientResponseError):
                asyncio.run(_fetch(url))
    assert seen_here == ["Bearer " + "t" * 16] * 2 and seen_there == []


def test_a_reply_too_large_or_not_an_object_is_refused(monkeypatch):
    monkeypatch.setattr(monitor, "MAX_STATUS_BYTES", 1000)
    replies = {"/big/status": json.dumps({"x": "y" * 2000}).encode(), "/list/status": b"[1, 2]",
               "/ok/status": b'{"worker": "w1"}'}
    with _server(lambda path: (200, {}, replies[path])) as (url, _):
        for read in (lambda u: monitor.get_status(u, None), lambda u: asyncio.run(_fetch(u))):
            with pytest.raises(ValueError, match="more than 1000 bytes"):
                read(url + "/big")
            with pytest.raises(ValueError, match="JSON list, not an object"):
                read(url + "/list")
            assert read(url + "/ok") == {"worker": "w1"}
