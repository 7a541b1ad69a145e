"""The embedded cluster's descriptor budget: every two workers may hold a stream each
way, all in one process, so it asks for the open-file limit that needs, and says when
the hard limit is short rather than let streams retry for ever."""
import logging
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


def test_the_soft_limit_is_raised_to_what_the_workers_need(limits, caplog):
    lim = limits(1024, 65536)
    with caplog.at_level(logging.WARNING):
        allow_descriptors(50)
    assert lim.set == [(descriptors_needed(50), 65536)] and not caplog.records


def test_a_hard_limit_too_low_is_used_whole_and_named(limits, caplog):
    lim = limits(1024, 20000)
    with caplog.at_level(logging.WARNING):
        allow_descriptors(100)
    assert lim.set == [(20000, 20000)]
    assert f"100 embedded workers may need {descriptors_needed(100)} file descriptors" in caplog.text
    assert "may open 20000" in caplog.text


def test_enough_is_left_alone(limits, caplog):
    lim = limits(20000, 20000)
    with caplog.at_level(logging.WARNING):
        allow_descriptors(20)
    assert lim.set == [] and not caplog.records
