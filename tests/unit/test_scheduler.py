import pytest

from streamnet.examples import wordcount
from streamnet.runtime.control.placement import NoWorkersError, assign, moved_tasks


def workers(**threads):
    return {w: {"host": "h", "port": i, "threads": t} for i, (w, t) in enumerate(sorted(threads.items()))}


def test_tasks_follow_compute_threads():
    t = wordcount.topology(split=4, counters=4)   # 9 tasks
    a = assign(t, workers(w1=1, w2=2))
    per = {w: sum(1 for x in a["tasks"].values() if x == w) for w in ("w1", "w2")}
    assert per == {"w1": 3, "w2": 6}
    assert a["workers"]["w2"] == "http://h:1"


def test_a_dead_worker_moves_only_its_tasks():
    t = wordcount.topology(split=3, counters=3)
    before = assign(t, workers(a=1, b=1, c=1))
    after = assign(t, workers(a=1, b=1), before)
    moved = moved_tasks(before, after)
    assert moved and all(old == "c" for old, _ in moved.values())
    assert set(after["tasks"].values()) == {"a", "b"}


def test_no_workers_is_a_clear_error():
    with pytest.raises(NoWorkersError, match="no live workers"):
        assign(wordcount.topology(), {})
