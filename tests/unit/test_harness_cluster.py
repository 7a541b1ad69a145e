"""The test and benchmark harness's Cluster: one whose start fails part-way (a worker
that cannot be started, Ctrl-C) leaves no worker process or files behind - there is
no Cluster object for the caller to close."""
import os

import pytest

from streamnet import testing


def test_a_cluster_whose_start_fails_part_way_stops_the_workers_it_started(monkeypatch):
    started, tmp = [], []
    real = testing.Cluster.start_worker

    def start_worker(self, name, extra=()):
        tmp.append(self.tmp)
        if started:
            raise OSError("cannot start a second worker")
        started.append(real(self, name, extra))       # a real process (its ZooKeeper is nowhere: it waits)
        return started[-1]
    monkeypatch.setattr(testing.Cluster, "start_worker", start_worker)
    with pytest.raises(OSError, match="second worker"):
        testing.Cluster("127.0.0.1:9", workers=3)
    assert started[0].poll() is not None               # stopped, and reaped
    assert not os.path.exists(tmp[0])
