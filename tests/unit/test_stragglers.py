"""Straggler attribution (training/stragglers.py) on plain timings."""
from streamnet.training.stragglers import Arrival, Stragglers


def A(unit, arrived, compute, queue=0.0, worker=None):
    return Arrival(unit, worker or f"w{unit}", arrived, compute, queue)


def test_a_slow_node_is_named_for_compute():
    s = Stragglers()
    v = s.judge(0.0, [A(0, 1.0, 0.9), A(1, 2.0, 1.9), A(2, 1.05, 0.95)])
    assert (v.unit, v.worker, v.reason) == (1, "w1", "compute")
    assert abs(v.late_s - 0.975) < 1e-9          # behind the others' median arrival


def test_a_slow_link_is_named_for_communication():
    v = Stragglers().judge(0.0, [A(0, 1.0, 0.9), A(1, 1.6, 0.9)])
    assert (v.unit, v.reason) == (1, "communication")


def test_a_busy_worker_is_named_for_queueing():
    v = Stragglers().judge(0.0, [A(0, 1.0, 0.9), A(1, 1.7, 0.9, queue=0.65)])
    assert (v.unit, v.reason) == (1, "queueing")


def test_balanced_rounds_and_the_first_round_have_no_straggler():
    s = Stragglers()
    assert s.judge(None, [A(0, 1.0, 0.9), A(1, 3.0, 2.9)]) is None          # no start known
    assert s.judge(0.0, [A(0, 1.0, 0.9), A(1, 1.01, 0.91)]) is None         # 10 ms of a 1 s round
    assert s.judge(0.0, [A(0, 1.0, 0.9)]) is None                           # one unit: nobody waits
    assert s.units == {}


def test_the_top_stragglers_are_those_that_held_the_most_time():
    s = Stragglers()
    for _ in range(3):
        s.judge(0.0, [A(0, 1.0, 0.9), A(1, 1.5, 1.4)])
    s.judge(0.0, [A(0, 3.0, 2.9), A(1, 1.0, 0.9)])
    top = s.top()
    assert [t["unit"] for t in top] == [0, 1]
    assert top[1] == {"unit": 1, "worker": "w1", "rounds": 3, "held_s": 1.5,
                      "reasons": {"compute": 3, "communication": 0, "queueing": 0}}
    assert s.rounds == 4


def test_the_line_a_client_prints():
    from streamnet.cli.progress import stragglers_line
    s = Stragglers()
    for _ in range(2):
        s.judge(0.0, [A(0, 1.0, 0.9), A(1, 2.5, 2.4)])
    line = stragglers_line({"rounds_judged": s.rounds, "top": s.top(), "last": None})
    assert line == "stragglers over 2 rounds: unit 1 on w1 held 2 (compute 2; the others waited 3.0 s)"
    assert stragglers_line(None) is None and stragglers_line({"rounds_judged": 5, "top": []}) is None
