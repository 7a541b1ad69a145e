import os
import signal
import threading
import time

import pytest

# keep numba's compiled kernels inside the checkout so a CI run compiles once
os.environ.setdefault("NUMBA_CACHE_DIR",
                      os.path.join(os.path.dirname(os.path.dirname(__file__)), ".numba-cache"))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# started as a background job of a script (`make test &`), pytest has SIGINT ignored, and so
# had every process the tests start: those that stop a daemon or a run with Ctrl-C waited out
# their timeouts (three UI tests failed). A handler, unlike an ignore, is not inherited.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _fds() -> set[str]:
    try:
        return set(os.listdir("/proc/self/fd"))
    except FileNotFoundError:
        return set()


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves threads or file descriptors (sockets, ports,
    files) behind. Waits on the condition with a deadline: shutdown is async."""
    threads_before = {t.ident for t in threading.enumerate()}
    fds_before = _fds()
    yield
    deadline = time.monotonic() + 10
    while True:
        extra_threads = [t for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
        extra_fds = _fds() - fds_before
        # an fd number may be reused by an unrelated file; only count sockets and pipes as leaks
        extra_fds = {fd for fd in extra_fds
                     if os.path.exists(f"/proc/self/fd/{fd}") and
                     os.readlink(f"/proc/self/fd/{fd}").startswith(("socket:", "pipe:", "anon_inode:"))}
        if not extra_threads and not extra_fds:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"leaked threads {[t.name for t in extra_threads]}, fds "
                        f"{[os.readlink(f'/proc/self/fd/{fd}') for fd in extra_fds if os.path.exists(f'/proc/self/fd/{fd}')]}")
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def zk_root(monkeypatch):
    """Each test's clusters live under a ZooKeeper root of their own ($STREAMNET_ZK_ROOT,
    which the workers and clients it starts inherit): a root belongs to the cluster whose
    worker made it (zk.ensure_root), and the tests make clusters of many secrets on one
    ensemble."""
    import uuid
    root = f"/streamnet-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("STREAMNET_ZK_ROOT", root)
    return root


@pytest.fixture
def keep_sigterm():
    """SIGTERM's handler restored after the test: `train` on the embedded cluster and
    `submit --wait` turn SIGTERM into Ctrl-C (their clean stop) in the test's process."""
    import signal
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.fixture(scope="session")
def zk():
    """A ZooKeeper for the cluster tests: $STREAMNET_TEST_ZK (make test starts one), or
    one started here for the session."""
    from streamnet.testing import ZooKeeper, zookeeper_installed
    hosts = os.environ.get("STREAMNET_TEST_ZK")
    if hosts:
        yield hosts
        return
    if not zookeeper_installed():
        pytest.skip("needs Debian's zookeeper package (make test installs it)")
    server = ZooKeeper().start()
    try:
        yield server.hosts
    finally:
        server.stop()


@pytest.fixture(params=["local", "zk"])
def mode(request):
    """The execution mode a test body runs on: the embedded LocalCluster, or
    streamnet-worker processes on a real ZooKeeper. `cluster_in_mode(mode, zk_hosts)`."""
    return request.param


@pytest.fixture
def zk_hosts(mode, request):
    """The ZooKeeper of the zk mode (None for local)."""
    return request.getfixturevalue("zk") if mode == "zk" else None
