"""Placement and the rebalance state machine (control/placement.py) on plain data,
and the assignment's stored form (assignment.py)."""
import pytest

from streamnet.examples import wordcount
from streamnet.runtime.assignment import DRAIN_TIMEOUT_S, Assignment, AssignmentError, moved_tasks
from streamnet.runtime.control.placement import NoWorkersError, assign, plan
from streamnet.runtime.topology import TopologyError


def workers(**threads):
    return {w: {"host": "h", "port": i, "threads": t} for i, (w, t) in enumerate(sorted(threads.items()))}


def test_tasks_follow_compute_threads():
    t = wordcount.topology(split=4, counters=4)   # 9 tasks
    a = assign(t, workers(w1=1, w2=2))
    per = {w: sum(1 for x in a.tasks.values() if x == w) for w in ("w1", "w2")}
    assert per == {"w1": 3, "w2": 6}
    assert a.workers["w2"] == "http://h:1"
    assert all(isinstance(task, int) for task in a.tasks)


def test_a_dead_worker_moves_only_its_tasks():
    t = wordcount.topology(split=3, counters=3)
    before = assign(t, workers(a=1, b=1, c=1))
    after = assign(t, workers(a=1, b=1), before)
    moved = moved_tasks(before, after)
    assert moved and all(old == "c" for old, _ in moved.values())
    assert set(after.tasks.values()) == {"a", "b"}


def test_no_workers_is_a_clear_error():
    with pytest.raises(NoWorkersError, match="no live workers"):
        assign(wordcount.topology(), {})


def test_assignment_json_round_trip_with_int_task_ids():
    a = Assignment(tasks={0: "w1", 10: "w2"}, workers={"w1": "http://h:1"}, threads={"w1": 2}, spec_version=3)
    d = a.to_json()
    assert d["tasks"] == {"0": "w1", "10": "w2"} and "phase" not in d
    assert Assignment.from_json(d) == a
    drain = Assignment(phase="draining", draining_since=5.0, spec_version=4)
    assert Assignment.from_json(drain.to_json()) == drain and drain.draining
    for bad in ({"tasks": {"x": "w"}}, {"tasks": []}, {"phase": "bogus"}, {"threads": {"w": "many"}}):
        with pytest.raises(AssignmentError):
            Assignment.from_json(bad)


SPEC = wordcount.topology(split=2, counters=2).to_dict()
W = workers(a=1, b=1)


def test_plan_places_a_new_topology_and_then_has_nothing_to_do():
    first = plan(SPEC, W, None, None, set(), 0.0)
    assert first.assignment is not None and len(first.assignment.tasks) == 5 and first.request is None
    again = plan(SPEC, W, first.assignment, None, set(), 1.0)
    assert again.assignment is None and again.spec is None


def test_plan_threads_request_is_written_then_cleared():
    current = plan(SPEC, W, None, None, set(), 0.0).assignment
    step = plan(SPEC, W, current, {"threads": {"a": 3, "gone": 9}}, set(), 1.0)
    assert step.assignment.threads == {"a": 3, "b": 1} and step.request == {}
    assert plan(SPEC, W, step.assignment, {"threads": {"a": 3}}, set(), 2.0).request == {}


def test_plan_refuses_thread_counts_no_worker_could_run_and_carries_out_the_rest():
    from streamnet.runtime.assignment import MAX_THREADS
    current = plan(SPEC, W, None, None, set(), 0.0).assignment
    step = plan(SPEC, W, current, {"threads": {"a": -3, "b": 2}}, set(), 1.0)
    assert step.assignment.threads == {"a": 1, "b": 2} and step.request == {}
    assert any("compute threads {'a': -3} refused" in n for n in step.notes)
    step = plan(SPEC, W, current, {"threads": {"a": MAX_THREADS + 1, "b": True}}, set(), 2.0)
    assert step.assignment is None and step.request == {} and "refused" in step.notes[0]


def test_plan_parallelism_change_is_two_phase():
    current = plan(SPEC, W, None, None, set(), 0.0).assignment
    request = {"parallelism": {"split": 4}, "threads": {"a": 2}}
    p1 = plan(SPEC, W, current, request, set(), 100.0)
    split = next(c for c in p1.spec["components"] if c["id"] == "split")
    assert split["parallelism"] == 4 and p1.spec["version"] == SPEC.get("version", 0) + 1
    assert p1.assignment.draining and not p1.assignment.tasks and p1.request == {"threads": {"a": 2}} and p1.again
    assert next(c for c in SPEC["components"] if c["id"] == "split")["parallelism"] == 2   # input untouched
    # phase 1 goes on until every live worker stopped the old tasks...
    assert plan(p1.spec, W, p1.assignment, p1.request, {"a"}, 101.0).assignment is None
    # ...then phase 2 places all 7 tasks under the new spec, with the kept threads
    p2 = plan(p1.spec, W, p1.assignment, p1.request, {"a", "b"}, 102.0)
    assert len(p2.assignment.tasks) == 7 and p2.assignment.spec_version == p1.spec["version"]
    assert p2.assignment.threads["a"] == 2 and p2.request == {} and not p2.assignment.draining
    # a worker that never acknowledges holds phase 1 only until the drain times out
    late = plan(p1.spec, W, p1.assignment, None, {"a"}, 100.0 + DRAIN_TIMEOUT_S + 1)
    assert late.assignment is not None and len(late.assignment.tasks) == 7


def test_plan_refuses_a_bad_parallelism_before_writing_anything():
    with pytest.raises(TopologyError):
        plan(SPEC, W, None, {"parallelism": {"split": 0}}, set(), 0.0)
