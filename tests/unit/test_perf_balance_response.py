"""perf/balance.py's speeds_response: how soon the balancer's shares matched the speeds
the workers measured under them (issue 13's "shares within 10 % of the measured
speeds"), read off a made-up share log and progress polls."""
import os
import sys

import pytest

_env = dict(os.environ)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "perf"))
from balance import speeds_response  # noqa: E402
os.environ.clear()
os.environ.update(_env)          # perf/balance.py pins BLAS threads for its own runs


def poll(t, speeds, under):
    """A progress poll: each unit's published speed and the share it was measured under
    (task 1 unloaded, task 2 beside the co-tenant)."""
    return {"t": t, "speeds": {"1": speeds[0], "2": speeds[1]}, "measured_under": {"1": under[0], "2": under[1]}}


ON = (2.0, 60, 100)          # the co-tenant's start: (t, rounds, the spout's step)
OFF = (6.0, 200, 250)


def test_a_change_matched_by_the_speeds_measured_under_it_counts_from_its_step():
    share_log = [{"step": 106, "t": 2.2, "shares": [1.36, 0.64]}]
    series = [poll(1.8, (23000, 23000), (1.0, 1.0)),
              poll(2.1, (23000, 11500), (1.0, 1.0)),       # the co-tenant seen at equal shares
              poll(2.3, (23000, 11500), (1.0, 1.0)),       # after the change, still the old record
              poll(2.6, (24000, 11000), (1.36, 0.64)),     # 11,000 / 17,500 = 0.629 of the mean
              poll(2.8, (24000, 11000), (1.36, 0.64)),     # the same record polled again
              poll(3.5, (23500, 11800), (1.36, 0.64))]
    out = speeds_response(share_log, series, ON, OFF)
    assert (out["rounds_to_speeds"], out["seconds_to_speeds"]) == (6, 0.2)
    first = out["matched_changes"][1]
    assert first["matched"] and first["records"] == 2
    assert out["matched_changes"][0]["matched"] is False      # equal shares under the co-tenant
    assert out["share_time_matched"] == pytest.approx((6.0 - 2.2) / (6.0 - 2.0), abs=1e-3)


def test_an_overshoot_does_not_count_until_a_change_the_speeds_bear_out():
    share_log = [{"step": 106, "t": 2.2, "shares": [1.5, 0.5]},
                 {"step": 140, "t": 3.4, "shares": [1.33, 0.67]},
                 {"step": 252, "t": 6.1, "shares": [1.0, 1.0]}]      # after the stop: not judged
    series = [poll(2.5, (23000, 8000), (1.0, 1.0)),                   # measured under the old shares
              poll(2.9, (23000, 15333), (1.5, 0.5)),                  # 0.8 of the mean, given 0.5
              poll(3.8, (23000, 11500), (1.33, 0.67)),                # 0.667
              poll(4.5, (23000, 11000), (1.33, 0.67))]                # 0.647
    out = speeds_response(share_log, series, ON, OFF)
    assert out["rounds_to_speeds"] == 40
    assert [c["matched"] for c in out["matched_changes"]] == [False, False, True]
    assert out["matched_changes"][1]["relative_speeds"] == [1.2, 0.8]
    assert out["share_time_matched"] == pytest.approx((6.0 - 3.4) / 4.0, abs=1e-3)


def test_shares_without_a_record_measured_under_them_are_not_matched():
    share_log = [{"step": 106, "t": 2.2, "shares": [1.36, 0.64]}]
    series = [poll(2.5, (23000, 11500), (1.0, 1.0))]
    out = speeds_response(share_log, series, ON, OFF)
    assert out["rounds_to_speeds"] is None and out["share_time_matched"] == 0.0
    assert out["matched_changes"][1]["relative_speeds"] is None


def test_no_cotenant_no_figure():
    assert speeds_response([{"step": 1, "t": 0.1, "shares": [1.0, 1.0]}], [], None, None)["rounds_to_speeds"] is None
