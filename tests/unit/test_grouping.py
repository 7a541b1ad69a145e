from collections import Counter

import pytest

from streamnet.runtime.dataplane.grouping import make_chooser, stable_hash
from streamnet.runtime.topology import TopologyError

TARGETS = [4, 5, 6, 7]


def choose(grouping, values=("a",), direct=None, local=frozenset(), fields=("word",), seed=1):
    return make_chooser(grouping, TARGETS, list(fields), set(local), seed)


def test_fields_sends_one_key_to_one_task():
    c = choose({"type": "fields", "fields": ["word"]})
    seen: dict[str, set] = {}
    for i in range(400):
        w = f"w{i % 40}"
        seen.setdefault(w, set()).update(c([w], None))
    assert all(len(v) == 1 for v in seen.values())
    assert len({next(iter(v)) for v in seen.values()}) == 4  # keys spread over all tasks
    # the same key goes to the same task from any emitter (stable across processes)
    other = make_chooser({"type": "fields", "fields": ["word"]}, TARGETS, ["word"], set(), seed=99)
    assert all(other([w], None) == [next(iter(t))] for w, t in seen.items())
    assert stable_hash(["x", 1]) == stable_hash(["x", 1])


def test_all_global_direct():
    assert choose({"type": "all"})(["a"], None) == TARGETS
    assert choose({"type": "global"})(["a"], None) == [4]
    d = choose({"type": "direct"})
    assert d(["a"], 6) == [6] and d(["a"], None) == []
    with pytest.raises(TopologyError, match="direct emit to task 9"):
        d(["a"], 9)


def test_shuffle_is_even():
    c = choose({"type": "shuffle"})
    counts = Counter(c(["a"], None)[0] for _ in range(400))
    assert set(counts) == set(TARGETS) and set(counts.values()) == {100}


def test_local_or_shuffle_prefers_local_tasks():
    c = choose({"type": "local_or_shuffle"}, local={5, 7, 100})
    assert {c(["a"], None)[0] for _ in range(50)} == {5, 7}
    c = choose({"type": "local_or_shuffle"}, local={100})
    assert {c(["a"], None)[0] for _ in range(50)} == set(TARGETS)


class Firsts:
    def __init__(self, n=1):
        self.n = n

    def choose(self, values, targets):
        return targets[: self.n]


def test_custom_grouping_hook():
    c = choose({"type": "custom", "class": "tests.unit.test_grouping:Firsts", "config": {"n": 2}})
    assert c(["a"], None) == [4, 5]
