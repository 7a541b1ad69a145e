"""Attacks of issue 15 against running workers (loopback only, bounded loops)."""
import os
import urllib.request

import pytest

from streamnet.examples import wordcount
from streamnet.runtime import LocalCluster, wait_for

from tests.unit.test_security_allow import popen_spec

pytestmark = pytest.mark.usefixtures("no_leaks")


def _status(port: int) -> dict:
    import json
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
        return json.load(r)


def test_a_spec_naming_popen_written_into_the_coordinator_is_refused_by_every_worker(tmp_path):
    marker = tmp_path / "popen-ran"
    with LocalCluster(workers=3) as c:
        c.state.submit_topology("evil", popen_spec(str(marker)))     # straight in: no client-side check
        wait_for(lambda: c.state.assignment("evil")[0] is not None, 20, "the leader to place evil")

        def refusals():
            return {k: v for k, v in c.state.results("evil").items() if k.startswith("refused.")}
        wait_for(lambda: len(refusals()) == 3, 20, "every worker to refuse evil")
        for w in c.workers:
            why = refusals()[f"refused.{w.id}"]
            assert "'subprocess:Popen' is not allowed" in why and "evil" not in w.runtimes
        assert not marker.exists()
        # the workers stay up and run what they may
        assert all(_status(w.port) for w in c.workers)
        results = c.run(wordcount.topology(count=500), timeout=60)
        assert wordcount.merge_counts(results) == wordcount.expected_counts(500, 0)
    assert not marker.exists()
