"""Readers of a worker's /status (`streamnet-submit status`, the UI) take at most
MAX_STATUS_BYTES, only a JSON object, and follow no redirect: the address comes from
a worker's record, and whoever answers there could send the monitor token elsewhere
or a reply without end."""
import asyncio
import contextlib
import json
import re
import threading
import time
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import pytest

from streamnet.runtime import monitor

OK = {"worker": "w1", "threads": 2, "busy_fraction": 0.5, "topologies": {}}


@contextlib.contextmanager
def _server(reply):
    """An HTTP server on a free port answering every GET with reply(path) -> (status,
    headers, body), a body given as a list being written a part at a time, 50 ms apart;
    yields (its url, the Authorization headers it was sent)."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            status, headers, body = reply(self.path)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            parts = body if isinstance(body, list) else [body]
            self.send_header("Content-Length", str(sum(map(len, parts))))
            self.end_headers()
            for i, part in enumerate(parts):
                if i:
                    time.sleep(0.05)
                self.wfile.write(part)
                self.wfile.flush()

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
               "/ok/status": json.dumps(OK).encode()}
    with _server(lambda path: (200, {}, replies[path])) as (url, _):
        for read in (lambda u: monitor.get_status(u, None), lambda u: asyncio.run(_fetch(u))):
            with pytest.raises(ValueError, match="more than 1000 bytes"):
                read(url + "/big")
            with pytest.raises(ValueError, match="JSON list, not an object"):
                read(url + "/list")
            assert read(url + "/ok") == OK


def test_a_status_that_comes_in_pieces_is_read_to_its_end():
    """aiohttp's read(n) returns what is buffered: the UI cut a status that came in more
    than one piece (a few KB over a network) and took the worker for unreachable."""
    status = json.dumps(dict(OK, links=["x" * 40] * 100)).encode()
    with _server(lambda path: (200, {}, [status[:1448], status[1448:]])) as (url, _):
        assert asyncio.run(_fetch(url)) == json.loads(status)
        assert monitor.get_status(url, None) == json.loads(status)


@pytest.mark.parametrize("reply,says", [
    ({"status": "ok"}, "threads None"),                                       # another program
    (dict(OK, topologies={"t": {"tasks": {"x": {}}}}), "topology 't': task 'x'"),   # killed the UI's sampler
    (dict(OK, topologies={"t": {"tasks": {"3": {"figures": [{"name": "f"}]}}}}), "task '3'"),
    (dict(OK, topologies={"t": {}}), "topology 't' has no tasks"),
])
def test_a_reply_that_is_not_a_workers_status_is_refused(reply, says):
    """It broke the UI's pages with a KeyError on every poll, or - a task id that is not a
    number - killed its sampler, whose pages then froze without a word."""
    with _server(lambda path: (200, {}, json.dumps(reply).encode())) as (url, _):
        for read in (lambda u: monitor.get_status(u, None), lambda u: asyncio.run(_fetch(u))):
            with pytest.raises(ValueError, match="is not a worker's status .*" + re.escape(says)):
                read(url)


def test_another_program_or_a_reply_nested_too_deep_is_a_value_error(monkeypatch):
    """`streamnet-submit status` catches OSError and ValueError: an SSH banner on the port
    (BadStatusLine) or JSON nested 100,000 deep (RecursionError) was a traceback."""
    import socket
    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(10)

        def banner():
            conn, _ = srv.accept()
            conn.sendall(b"SSH-2.0-OpenSSH_9.0\r\n")
            conn.close()
        t = threading.Thread(target=banner, daemon=True)
        t.start()
        with pytest.raises(ValueError, match="did not answer HTTP"):
            monitor.get_status(f"http://127.0.0.1:{srv.getsockname()[1]}", None)
        t.join(10)
        assert not t.is_alive()
    with _server(lambda path: (200, {}, b"[" * 100_000 + b"]" * 100_000)) as (url, _):
        with pytest.raises(ValueError, match="nested too deep"):
            monitor.get_status(url, None)
