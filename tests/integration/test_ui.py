"""Observability: /metrics parsed by prometheus_client during a training run; the web UI
as a daemon on ZooKeeper, embedded in `train --ui`, and in a real browser (Debian's
headless chromium) during a training run on the embedded cluster.

Set STREAMNET_UI_SCREENSHOTS=docs to write the pages' screenshots (docs/ui-*.png)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from contextlib import contextmanager

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamnet.runtime import LocalCluster, wait_for
from streamnet.testing import ROOT, Relay, running_cluster
from streamnet.training import DataConfig
from streamnet.training.config import lenet5_mixbp
from streamnet.training.nsmap import build_topology
from streamnet.ui.server import for_local_cluster

pytestmark = pytest.mark.usefixtures("no_leaks")

TRAINING_FAMILIES = {"streamnet_training_loss", "streamnet_training_test_accuracy", "streamnet_training_epoch",
                     "streamnet_training_samples", "streamnet_training_sync_rounds",
                     "streamnet_training_replayed_samples", "streamnet_training_compute_seconds"}
NSMAP_COMPONENTS = {"data", "compute", "sync", "eval", "checkpoint"}


@contextmanager
def training(epochs: int):
    """NS-Map (LeNet-5, MixBP, 2 units) on synthetic data on 2 embedded workers; killed on exit
    whether or not it ended."""
    cfg = lenet5_mixbp(data=DataConfig(dataset="synthetic", synthetic_train=1024, synthetic_test=256),
                       epochs=epochs, threads=2, seed=1)
    topo = build_topology(cfg, name="ui-run")
    with LocalCluster(workers=2, threads=1) as cluster:
        cluster.submit(topo)
        try:
            yield cluster
        finally:
            cluster.kill(topo.name, timeout=60)


def _families(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def test_metrics_have_the_training_families_during_a_run():
    with training(epochs=500) as cluster:
        seen: dict = {}

        def all_families():
            for w in cluster.workers:
                seen.update(_families(w.port))
            return TRAINING_FAMILIES <= set(seen)
        wait_for(all_families, 120, "every training family on the workers' /metrics", interval=0.2)
        assert any(n.startswith("process_") for n in seen)
        acc = seen["streamnet_training_test_accuracy"].samples[0]
        assert acc.labels["component"] == "eval" and 0.0 <= acc.value <= 1.0
        units = {s.labels["unit"] for s in seen["streamnet_training_compute_seconds"].samples}
        assert units and units <= {"0", "1"} and seen["streamnet_training_compute_seconds"].type == "counter"


def _get_json(port: int, path: str):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return json.load(r)
    except OSError:
        return None          # not listening (yet, or any more)


def _announced_port(proc: subprocess.Popen, says: str, timeout: float = 120.0) -> int:
    """The port a process started with port 0 announces on stderr in a line with `says`
    (http://HOST:PORT/): no free port picked here that another program may take first."""
    import re
    import threading
    found: list = []

    def read():
        for line in proc.stderr:
            m = says in line and re.search(r"http://[^:/]+:(\d+)/", line)
            if m:
                found.append(int(m.group(1)))
                return
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    assert found, f"no '{says} http://...' line on stderr within {timeout:.0f} s"
    return found[0]


def test_streamnet_ui_reads_a_zookeeper_cluster(zk):
    """The daemon: the cluster's workers (their /status) and a topology's graph, read with the
    cluster secret; Ctrl-C (or SIGTERM) ends it with 0."""
    with running_cluster(zk, workers=2) as (c, state):
        submitted = c.submit_cli("submit", "wordcount", "--set", "count=1000")
        assert submitted.returncode == 0, submitted.stderr
        ui = subprocess.Popen([sys.executable, "-m", "streamnet.ui.cli", *c.args(), "--port", "0",
                               "--poll", "0.3"], stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            port = _announced_port(ui, "streamnet-ui: serving cluster")
            def get(path):
                return _get_json(port, path)
            wait_for(lambda: (get("/api/cluster") or {}).get("workers") and
                     {w["id"] for w in get("/api/cluster")["workers"] if w["busy_ratio"] is not None} ==
                     set(state.workers()), 60, "streamnet-ui to show both workers' status", interval=0.2)
            topo = wait_for(lambda: next(iter((get("/api/topologies") or {}).get("topologies", [])), None), 60,
                            "streamnet-ui to show the topology", interval=0.2)
            assert {n["id"] for n in topo["graph"]["nodes"]} == {"sentences", "split", "count"}
            assert get("/api/training") == {"runs": []}          # word count is no training run
        finally:
            rc, out = _stop(ui, within=30)
        assert rc == 0, out
        assert "Traceback" not in out, out


def _stop(ui: subprocess.Popen, within: float) -> tuple[int, str]:
    """SIGINT, then (rc, stderr) once it exits; past `within` seconds its threads' stacks
    (SIGUSR1: faulthandler) before it is killed, so that a hang says where."""
    ui.send_signal(signal.SIGINT)
    try:
        err = ui.communicate(timeout=within)[1]
        return ui.returncode, err
    except subprocess.TimeoutExpired:
        ui.send_signal(signal.SIGUSR1)
        try:
            err = ui.communicate(timeout=5)[1]
        except subprocess.TimeoutExpired:
            ui.kill()
            err = ui.communicate()[1]
        return ui.returncode, f"no exit {within:.0f} s after SIGINT; stacks:\n{err}"


def test_streamnet_ui_stops_while_zookeeper_does_not_answer(zk):
    """Ctrl-C ends the daemon even while a coordinator read waits on a ZooKeeper that
    stopped answering (connection open, nothing comes back): no thread it waits for at
    exit may wait on ZooKeeper. Its calls' deadline is 60 s here (--session-timeout), so
    the exit would take 26 s or more if one did (kazoo gives up on a silent server after
    2/3 of the session timeout the server grants, at most 40 s by default)."""
    host, port = zk.split(",")[0].rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost"):
        pytest.skip("needs a local ZooKeeper to relay to")
    with running_cluster(zk, workers=1) as (c, state), Relay(int(port)) as relay:
        args = c.args(relay.address)
        args[args.index("--session-timeout") + 1] = "60"
        ui = subprocess.Popen([sys.executable, "-m", "streamnet.ui.cli", *args, "--port", "0", "--poll", "0.2"],
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            ui_port = _announced_port(ui, "streamnet-ui: serving cluster")
            wait_for(lambda: [w["id"] for w in (_get_json(ui_port, "/api/cluster") or {}).get("workers", [])] ==
                     ["w0"], 60, "streamnet-ui to show the worker", interval=0.2)
            relay.hold()
            wait_for(lambda: relay.bytes_held > 0, 10, "the UI to send a read the relay holds", interval=0.05)
        finally:
            rc, out = _stop(ui, within=20)
        assert rc == 0, out


def test_train_ui_serves_the_embedded_cluster_while_it_trains():
    """`streamnet-submit train --ui PORT`: the UI is up while the run goes (its training
    page has accuracy points), and gone with it; Ctrl-C stops the run cleanly."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "streamnet.cli.submit", "train", "--dataset", "synthetic",
                          "--epochs", "5000", "--workers", "2", "--ui", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        port = _announced_port(p, "streamnet UI on")
        run = wait_for(lambda: next((r for r in (_get_json(port, "/api/training") or {}).get("runs", [])
                                     if r["accuracy"]), None), 120, "train --ui to show an evaluated epoch",
                       interval=0.2)
        assert run["name"] == "lenet5-mixbp" and len(run["per_unit"]) == 2
        assert {w["id"] for w in _get_json(port, "/api/cluster")["workers"]} == {"w0", "w1"}
    finally:
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
    assert "Traceback" not in err, err
    # a clean stop: the round in flight finished, and a run cut short exits 1
    assert p.returncode == 1 and "stopped by a signal at step" in err, (p.returncode, err)
    assert _get_json(port, "/api/cluster") is None      # the UI went with the run


# -- the browser ------------------------------------------------------------------------
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@contextmanager
def chromium():
    """Headless chromium through chromedriver, with a fresh profile; the flags keep it
    off the network (without them it waits on lookups on a machine with none)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="streamnet-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--window-size=1400,1000", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = None
    try:
        driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        if driver is not None:
            driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _js_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver "
                                                            "(make test installs them)")
def test_ui_in_a_browser_during_training():
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    shots = os.environ.get("STREAMNET_UI_SCREENSHOTS")

    def until(driver, what: str, fn, timeout: float = 90):
        """fn(driver) until truthy; the pages redraw every poll, so an element found may go
        stale before it is read: that is a retry, not a failure."""
        return WebDriverWait(driver, timeout, poll_frequency=0.2,
                             ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
                             ).until(lambda d: fn(d), message=what)

    def shoot(driver, page: str):
        if shots:
            driver.save_screenshot(os.path.join(shots, f"ui-{page}.png"))

    with training(epochs=2000) as cluster, for_local_cluster(cluster, poll_s=0.5) as ui, chromium() as driver:
        driver.get(ui.url + "#cluster")
        rows = until(driver, "the cluster page to list both workers",
                     lambda d: {r.get_attribute("data-worker") for r in
                                d.find_elements(By.CSS_SELECTOR, "#workers tbody tr")} == {"w0", "w1"} or None)
        assert rows
        until(driver, "a leader to be shown", lambda d: d.find_element(By.ID, "leader").text in ("w0", "w1"))
        shoot(driver, "cluster")

        driver.get(ui.url + "#topologies")
        until(driver, "the graph to show every NS-Map component",
              lambda d: {n.get_attribute("data-id") for n in
                         d.find_elements(By.CSS_SELECTOR, "[data-topology='ui-run'] svg.graph g.node")}
              == NSMAP_COMPONENTS)
        until(driver, "the groupings as edge labels", lambda d: {"direct", "all [params]", "all [resync]"} <= {
            t.text for t in d.find_elements(By.CSS_SELECTOR, "svg.graph text.edge-label")})
        until(driver, "per-component figures", lambda d: d.find_element(
            By.CSS_SELECTOR, "[data-component='compute'] td:nth-child(4)").text not in ("", "–", "0"))
        shoot(driver, "topologies")

        driver.get(ui.url + "#training")
        chart = "[data-run='ui-run'] svg[data-chart='accuracy']"
        points = lambda d: int(d.find_element(By.CSS_SELECTOR, chart).get_attribute("data-points"))  # noqa: E731
        first = until(driver, "the accuracy curve's first point", lambda d: points(d) or None, timeout=120)
        until(driver, "the accuracy curve to gain a point after another epoch", lambda d: points(d) > first,
              timeout=120)
        until(driver, "the loss curve and the per-unit bars", lambda d: int(d.find_element(
            By.CSS_SELECTOR, "[data-run='ui-run'] svg[data-chart='loss']").get_attribute("data-points")) > 1
            and len(d.find_elements(By.CSS_SELECTOR, "svg[data-chart='units'] rect")) >= 6)
        shoot(driver, "training")
        assert _js_errors(driver) == []
