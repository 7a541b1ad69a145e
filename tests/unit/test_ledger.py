import numpy as np

from streamnet.training.ledger import SampleLedger


def _plan():
    # 2 units, unit 0 has 3 rounds, unit 1 has 2; each round one batch of 2 samples
    return [[[np.array([0, 1])], [np.array([2, 3])], [np.array([4, 5])]],
            [[np.array([6, 7])], [np.array([8, 9])]]]


def test_clean_epoch_has_no_faults():
    led = SampleLedger(2)
    for r in range(3):
        led.record(1, r, [0, 1] if r < 2 else [0], rounds=3)
    led.close(1, _plan())
    assert led.clean(1) and led.report(lambda e: _plan()) == {}


def test_missed_and_doubled_work_is_reported_as_samples():
    led = SampleLedger(2)
    led.record(1, 0, [0, 1], rounds=3)
    led.record(1, 1, [0], rounds=3)        # unit 1's round 1 (samples 8, 9) never combined
    led.record(1, 2, [0], rounds=3)
    led.record(1, 2, [0], rounds=3)        # unit 0's round 2 (samples 4, 5) combined twice
    led.record(1, 2, [0], rounds=3, delta=-1)   # ... and undone once: clean again
    led.record(1, 0, [1], rounds=3)        # unit 1's round 0 twice
    restored = SampleLedger(2)
    restored.load_state(led.to_state())    # survives a sync bolt's restart
    restored.close(1, _plan())
    assert not restored.clean(1)
    assert restored.report(lambda e: _plan()) == {"1": {"missed_samples": 2, "missed_first": [8, 9],
                                                        "doubled_samples": 2, "doubled_first": [6, 7]}}


def test_a_round_in_which_a_unit_had_no_batch_is_neither_missed_nor_doubled():
    """Load balancing's last round of an epoch may cut a unit no batch (an empty entry):
    with nothing to count there, it is no fault - it was reported missed, and the report
    then raised on an empty concatenation (stats() in the sync task's close)."""
    plan = [[[np.array([0, 1])], [np.array([2, 3])], [np.array([4, 5])]],
            [[np.array([6, 7])], [np.array([8, 9])], []]]
    led = SampleLedger(2)
    led.record(1, 0, [0, 1], rounds=3)
    led.record(1, 1, [0, 1], rounds=3)
    led.record(1, 2, [0], rounds=3)        # unit 1 had nothing in round 2
    led.close(1, plan)
    assert led.clean(1) and led.report(lambda e: plan) == {}
    led = SampleLedger(2)
    for r in range(3):
        led.record(1, r, [0, 1], rounds=3)
    led.record(1, 2, [0, 1], rounds=3)     # round 2 counted twice: unit 0's samples doubled, unit 1 had none
    led.close(1, plan)
    assert led.report(lambda e: plan) == {"1": {"missed_samples": 0, "missed_first": [], "doubled_samples": 2,
                                                "doubled_first": [4, 5]}}
