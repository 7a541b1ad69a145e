"""What workers write under a topology's node (task state, done and stopped marks, the
assignment versions they applied, results, the leader's balance log) a submit
credential may read, and delete with the topology, but not write: it could forge
another topology's task state, or that the workers had applied an assignment."""
import pytest

from streamnet.examples import wordcount
from streamnet.runtime import wait_for
from streamnet.runtime.control import kill_topology, roles
from streamnet.runtime.control.zk import UnauthorisedError
from streamnet.testing import running_cluster
from tests.integration.test_security import _credential, _state_of


def test_a_submitter_reads_and_deletes_what_workers_write_but_cannot_write_it(zk, tmp_path):
    with running_cluster(zk, workers=1) as (c, state):
        topo = wordcount.topology(name="slow", count=3000, delay_s=0.001, max_spout_pending=20)
        state.submit_topology(topo.name, topo.to_dict())
        applied = state.path("topologies", "slow", "applied")
        wait_for(lambda: state.coord.exists(applied) is not None and state.coord.children(applied), 30, "an applied mark")
        sub = _state_of(c, _credential(c, tmp_path, "submit"))
        try:
            worker = sub.coord.children(applied)[0]                 # it reads them
            mark = sub.path("topologies", "slow", "applied", worker)
            before = sub.coord.get(mark)[0]
            with pytest.raises(UnauthorisedError):
                sub.coord.set(mark, b"999999")
            for node in sorted(roles.WORKER_WRITTEN):
                with pytest.raises(UnauthorisedError):
                    sub.coord.create(sub.path("topologies", "slow", node, "forged"), b"x")
            assert state.coord.get(mark)[0] == before
            acl = state.coord.zk.get_acls(mark)[0]
            submit_id = roles.role_ids(open(c.secret_file, "rb").read().strip())[roles.SUBMIT]
            assert [a.perms for a in acl if a.id == submit_id] == [roles.R | roles.D]
            kill_topology(sub, "slow", 60)                          # and deletes them with the topology
            assert "slow" not in state.topology_names() and state.coord.exists(state.path("topologies", "slow")) is None
        finally:
            sub.coord.close()
