"""A worker that runs out of descriptors says so once a minute, not a traceback a second."""
import asyncio
import logging

from streamnet.runtime.dataplane import accept_shortage
from streamnet.runtime.dataplane.accept_shortage import MESSAGE, AcceptShortage
from streamnet.testing import until


def _context():
    return {"message": MESSAGE, "exception": OSError(24, "Too many open files")}


def test_a_shortage_is_one_line_a_minute_with_the_count_of_the_others(caplog):
    now = [100.0]
    handler = AcceptShortage(repeat_s=60.0, clock=lambda: now[0])
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(30):            # asyncio retries once a second
                handler(loop, _context())
                now[0] += 1.0
            lines = [r for r in caplog.records if "cannot accept connections" in r.getMessage()]
            assert len(lines) == 1
            first = lines[0].getMessage()
            assert "Too many open files" in first and "open files allowed:" in first and "more such" not in first
            assert lines[0].exc_info is None       # one line, no traceback
            now[0] = 160.0
            handler(loop, _context())
        lines = [r.getMessage() for r in caplog.records if "cannot accept connections" in r.getMessage()]
        assert len(lines) == 2 and "29 more such reports since the last" in lines[1]
    finally:
        loop.close()


def test_other_reports_go_to_the_default_handler(caplog):
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            AcceptShortage()(loop, {"message": "Task exception was never retrieved", "exception": ValueError("x")})
        assert any("Task exception was never retrieved" in r.getMessage() for r in caplog.records)
    finally:
        loop.close()


def test_install_keeps_a_handler_already_set():
    loop = asyncio.new_event_loop()
    try:
        accept_shortage.install(loop)
        assert isinstance(loop.get_exception_handler(), AcceptShortage)
        mine = lambda loop, context: None  # noqa: E731
        loop.set_exception_handler(mine)
        accept_shortage.install(loop)
        assert loop.get_exception_handler() is mine
    finally:
        loop.close()


def test_the_ui_daemon_reports_a_shortage_the_same_way(monkeypatch):
    from types import SimpleNamespace

    from streamnet.ui import cli, server
    served = asyncio.Event()

    class Runner:
        async def cleanup(self):
            pass

    async def serve(state, host, port, poll_s, *options):     # token, allowed hosts, ...: not looked at
        served.set()
        return Runner(), 1234
    monkeypatch.setattr(server, "serve", serve)

    async def run():
        daemon = asyncio.ensure_future(cli._serve(SimpleNamespace(cluster="c"), "127.0.0.1", 0, 1.0))
        await until(lambda: served.is_set() or daemon.done(), "the daemon to serve")
        if daemon.done():
            daemon.result()             # what it raised
        handler = asyncio.get_running_loop().get_exception_handler()
        daemon.cancel()
        await asyncio.gather(daemon, return_exceptions=True)
        return handler
    assert isinstance(asyncio.run(run()), AcceptShortage)


CHILD = r"""
import asyncio, os, resource, sys, time
from streamnet.runtime.dataplane import accept_shortage
import logging
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
seen = []
class Counting(accept_shortage.AcceptShortage):
    def __call__(self, loop, context):
        if context.get("message") == accept_shortage.MESSAGE:
            seen.append(1)
        super().__call__(loop, context)
async def main():
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(Counting())
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    hold = []
    try:
        while True:
            hold.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    print("full", flush=True)
    deadline = time.monotonic() + 30
    while len(seen) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for fd in hold:
        os.close(fd)
    server.close()
    print("reports", len(seen), flush=True)
asyncio.run(main())
"""


def test_a_real_descriptor_shortage_is_reported_once():
    """A process out of descriptors, a client that keeps connecting: asyncio reports every
    failed accept (a pass over the backlog a second), and the log has one line of it and
    no traceback."""
    import socket
    import subprocess
    import sys
    import time
    from tests.unit.test_cli_mistakes import read_line
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    conns = []
    try:
        buf, deadline = bytearray(), time.monotonic() + 60
        line = read_line(p.stdout, buf, deadline, "the child's port")
        assert line, "the child ended before it listened"
        port = int(line)
        assert read_line(p.stdout, buf, deadline, "the child to run out of descriptors").strip() == "full"
        deadline = time.monotonic() + 40
        while p.poll() is None:          # the child ends after its third report (or its own deadline)
            assert time.monotonic() < deadline, "the child did not end"
            try:
                conns.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            except OSError:
                pass                     # a full backlog: the next attempt waits in connect
            time.sleep(0.05)
        out, err = p.communicate(timeout=10)
        out = buf.decode() + out
    finally:
        p.kill()
        p.communicate(timeout=10)
        for c in conns:
            c.close()
    # asyncio reports each failed accept of a pass over the backlog, then again a second later
    assert int(out.split("reports")[1]) >= 3, (out, err)
    assert err.count("cannot accept connections") == 1 and "Traceback" not in err, err
