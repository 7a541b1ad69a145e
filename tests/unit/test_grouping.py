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


def test_stable_hash_is_the_same_in_every_process():
    """Workers are separate processes, each with its own str hash seed: a key's hash
    (so its fields-grouping task) must not depend on PYTHONHASHSEED."""
    import json
    import os
    import subprocess
    import sys
    keys = [["x", 1], ["storm"], ["gradient", 2.5], ["zookeeper", None, True]]
    code = ("import json, sys; from streamnet.runtime.dataplane.grouping import stable_hash; "
            "print(json.dumps([stable_hash(k) for k in json.loads(sys.argv[1])]))")
    here = [stable_hash(k) for k in keys]
    seen = []
    for seed in ("0", "1", "12345"):
        r = subprocess.run([sys.executable, "-c", code, json.dumps(keys)], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr
        seen.append(json.loads(r.stdout))
    assert seen == [here] * 3
    assert len(set(here)) == len(here)


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
