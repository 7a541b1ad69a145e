"""The embedded cluster's descriptor budget: every two workers may hold a stream each
way, all in one process, so it asks for the open-file limit that needs (up to the hard
limit)."""
import resource

import pytest

from streamnet.runtime import local
from streamnet.runtime.local import allow_descriptors, descriptors_needed


class _Limits:
    def __init__(self, soft, hard):
        self.soft, self.hard, self.set = soft, hard, []

    def get(self, which):
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def put(self, which, limits):
        assert which == resource.RLIMIT_NOFILE
        self.set.append(limits)
        self.soft = limits[0]


@pytest.fixture
def limits(monkeypatch):
    def make(soft, hard):
        lim = _Limits(soft, hard)
        monkeypatch.setattr(local.resource, "getrlimit", lim.get)
        monkeypatch.setattr(local.resource, "setrlimit", lim.put)
        return lim
    return make


def test_a_full_mesh_grows_with_the_square_of_the_workers():
    assert descriptors_needed(2) < descriptors_needed(20) < 1000 < 20000 < descriptors_needed(100)


def test_the_soft_limit_is_raised_to_what_the_workers_need(limits):
    lim = limits(1024, 65536)
    allow_descriptors(50)
    assert lim.set == [(descriptors_needed(50), 65536)]


def test_a_hard_limit_too_low_is_used_whole(limits):
    lim = limits(1024, 20000)
    allow_descriptors(100)
    assert lim.set == [(20000, 20000)]


def test_enough_is_left_alone(limits):
    lim = limits(20000, 20000)
    allow_descriptors(20)
    assert lim.set == []


def _train_config(*argv):
    from streamnet.cli.submit import build_parser
    from streamnet.cli.train_args import config_from_args
    return config_from_args(build_parser().parse_args(["train", "--dataset", "synthetic", *argv]))


def test_train_gives_itself_a_sync_task_per_unit_up_to_eight():
    """With one per unit, 100 embedded workers were a full mesh (19,800 sockets in one
    process, past its 20,000 open files): links failed for want of descriptors for ever."""
    assert _train_config("--workers", "3").sync_tasks == 3
    assert _train_config("--workers", "100").sync_tasks == 8
    assert _train_config("--workers", "100", "--sync-tasks", "50").sync_tasks == 50
