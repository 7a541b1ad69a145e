"""perf/chaos.py's recovery figures on made-up timelines of (seconds, sync rounds)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "perf"))
from chaos import recovery  # noqa: E402


def _timeline(rate_at, end: float, step: float = 0.1) -> list:
    """Progress samples of a run whose rounds/s at time t is rate_at(t)."""
    out, rounds, t = [], 0.0, 0.0
    while t <= end:
        out.append((round(t, 3), rounds))
        rounds += rate_at(t) * step
        t += step
    return out


def test_throughput_back_to_its_rate_after_a_pause_recovers_after_the_pause():
    tl = _timeline(lambda t: 0.0 if 10 <= t < 11 else 20.0, 30.0)      # the kill at 10 s stops it for 1 s
    r = recovery(tl, kill_s=10.0, detection_s=0.5)
    assert r["recovered_s"] == pytest.approx(0.9, abs=0.25)     # a 2 s window at >= 95 % of 20/s (0.1 s samples)
    assert r["steady_over_before"] == pytest.approx(1.0, abs=0.02)


def test_a_rate_that_fell_for_good_recovers_to_a_third_of_the_rate_before():
    """'Recovered' to the survivors' own steady rate at once; the ratio to the rate before the
    kill is what says the run lost two thirds of its speed (it was not reported)."""
    tl = _timeline(lambda t: 30.0 if t < 10 else 10.0, 30.0)
    r = recovery(tl, kill_s=10.0, detection_s=0.5)
    assert r["recovered_s"] == pytest.approx(0.0, abs=0.15)
    assert r["steady_over_before"] == pytest.approx(1 / 3, abs=0.02)
    assert r["rate_before_rps"] == pytest.approx(30.0, rel=0.02)


def test_a_slow_ramp_back_does_not_lower_the_steady_rate():
    """The steady rate is the later half's: a ramp over the first seconds after the kill
    lowered the average it was taken over, and 'recovered' came sooner."""
    tl = _timeline(lambda t: 20.0 if t < 10 else min(20.0, 2.0 * (t - 10)), 40.0)
    r = recovery(tl, kill_s=10.0, detection_s=0.5)
    assert r["capacity_rps"] == pytest.approx(20.0, rel=0.02)
    assert r["recovered_s"] == pytest.approx(8.5, abs=0.3)         # 2 s windows reach 19/s once t >= ~18.5


def test_a_run_that_ends_too_soon_after_the_kill_has_no_recovery_figure():
    tl = _timeline(lambda t: 20.0, 12.0)
    assert recovery(tl, kill_s=10.0, detection_s=0.5)["recovered_s"] is None
