"""Training survives the loss of a worker: SIGKILL of a compute unit's host and of
the sync bolt's host, mid-run, on a real ZooKeeper."""
import os
import time

import pytest

from streamnet.runtime import wait_for
from streamnet.training import DataConfig, lenet5_mixbp
from streamnet.training.nsmap import build_topology
from streamnet.training.summary_from_results import summarise

from streamnet.testing import finish, running_cluster, zookeeper_installed
from .test_zk_cluster import zk  # noqa: F401 - the module-scoped ZooKeeper fixture

FASHION = "/usr/share/datasets/fashion-mnist"
pytestmark = [pytest.mark.skipif(not zookeeper_installed(), reason="needs Debian's zookeeper package"),
              pytest.mark.skipif(not os.path.isdir(FASHION), reason="needs dataset-fashion-mnist")]


def _config():
    return lenet5_mixbp(units=2, epochs=3, data=DataConfig(train_limit=12000, test_limit=2000))


@pytest.mark.parametrize("victim", ["compute", "sync"])
def test_training_survives_sigkill(zk, victim):  # noqa: F811
    cfg = _config()
    topo = build_topology(cfg, name=f"faults-{victim}")
    with running_cluster(zk, workers=3) as (c, state):
        state.submit_topology(topo.name, topo.to_dict())
        assignment = wait_for(lambda: (state.assignment(topo.name)[0] or {}).get("tasks"), 30, "the assignment")
        host = assignment[str(topo.tasks(victim)[0])]

        def progressed():
            p = state.results(topo.name).get("sync.0.progress")
            return p and p["rounds"] >= 20
        wait_for(progressed, 120, "training to get going", interval=0.2)
        c.kill9(host)
        t_kill = time.monotonic()
        wait_for(lambda: host not in (state.assignment(topo.name)[0] or {}).get("tasks", {}).values(), 15,
                 "the dead worker's tasks to move", interval=0.05)
        moved_after = time.monotonic() - t_kill
        results = finish(state, topo.name, timeout=600)
    s = summarise(cfg, results, workers=2)
    print(f"killed {victim} host {host}: tasks moved after {moved_after:.1f} s; accuracy {s.test_accuracy:.2%}, "
          f"replayed {s.extra['samples_replayed']}, recoveries {s.extra['sync_recoveries']}, "
          f"epoch samples {results['sync.0.stats']['epoch_samples']}")
    assert s.extra["each_sample_counted_once"] is True
    assert results["sync.0.stats"]["epoch_samples"] == {"1": 12000, "2": 12000, "3": 12000}
    assert s.test_accuracy >= 0.80
    assert len(s.history) == 3
