"""`make report`'s machinery on a tiny configuration (synthetic data, embedded cluster):
every section, figure and number is written."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytest.importorskip("matplotlib")


def report(out, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "perf", "report.py"), "--profile", "tiny",
                           "--dataset", "synthetic", "--out", str(out), *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    r = report(out)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


def test_the_report_has_every_section_figure_and_verdict(tiny_report):
    out = tiny_report
    page = (out / "README.md").read_text()
    data = json.loads((out / "report.json").read_text())
    for key, title in (("speedup", "## 1. Speed-up with workers"), ("recovery", "## 2. Recovery"),
                       ("bp_family", "## 3. The BP family"), ("threads", "## 4. Threads and load")):
        assert title in page, title
        assert (out / f"{key}.png").stat().st_size > 1000, f"{key}.png"
        assert f"]({key}.png)" in page
        assert data[key]["verdict"].split(":")[0] in ("holds", "holds partly", "does not hold here",
                                                      "not decided here"), data[key]["verdict"]
    assert page.count("**Claim.**") == 4 and page.count("**Verdict:") == 4
    assert data["machine"]["cores"] == os.cpu_count()
    runs = data["speedup"]["runs"]
    assert set(runs) == {"cumulative/1", "cumulative/2", "mixbp-H8/1", "mixbp-H8/2"}
    assert all(v["samples_per_s"] > 0 for v in runs.values())
    assert data["recovery"]["trials"] and all(t["each_sample_counted_once"] for t in data["recovery"]["trials"])


def test_only_reruns_the_named_sections_and_keeps_the_others(tiny_report):
    before = json.loads((tiny_report / "report.json").read_text())
    r = report(tiny_report, "--only", "bp_family")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "1. Speed-up" not in r.stdout and "3. The BP family" in r.stdout       # only that section ran
    after = json.loads((tiny_report / "report.json").read_text())
    for key in ("speedup", "recovery", "threads", "date", "machine"):
        assert after[key] == before[key], key
    assert after["rerun"]["sections"] == ["bp_family"] and after["bp_family"]["verdict"]
    assert set(after["figures"]) == set(before["figures"])
    assert "re-run on" in (tiny_report / "README.md").read_text()


def test_render_derives_the_verdicts_again_and_measures_nothing(tiny_report, tmp_path):
    data = json.loads((tiny_report / "report.json").read_text())
    # a co-tenant run as an older rule judged it: faster under load, the shares never moved
    data["threads"]["spread"] = 1.87      # an older rule's: the fastest row over the slowest, 1 thread included
    data["threads"]["1 unit, batch 64, its step on 2 threads"] = 30000.0
    data["threads"]["2 units, batch 32, 2 threads, one each"] = 45000.0
    data["threads"]["balance"] = {"ratios": {"epoch_time_load_over_static": [0.79],
                                             "accuracy_load_minus_static_pp": 0.2},
                                  "load": {"rounds_to_follow": None, "rounds_to_first_change": 174,
                                           "rounds_to_return": 55}}
    data["threads"]["verdict"] = "holds: an older rule's words"
    data["recovery"]["verdict"] = "holds: a node failure: fine; a loaded node (section 4): an older rule's words"
    (tmp_path / "report.json").write_text(json.dumps(data))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "perf", "report.py"), "--render", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    after = json.loads((tmp_path / "report.json").read_text())
    assert after["threads"]["verdict"].startswith("holds partly: allocations differ by 1.50x in samples/s (the "
                                                  "same 2 threads") and after["threads"]["spread"] == 1.5
    assert "did not follow the co-tenant (first change after 174 rounds)" in after["threads"]["verdict"]
    assert after["recovery"]["verdict"].startswith(("holds partly: a node failure: fine; a loaded node",
                                                    "does not hold here: a node failure: fine; a loaded node"))
    assert after["speedup"] == data["speedup"] and after["date"] == data["date"]    # nothing re-measured
    page = (tmp_path / "README.md").read_text()
    assert "Verdicts derived again" in page and after["threads"]["verdict"] in page


def test_render_without_a_report_says_so(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "perf", "report.py"), "--render", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode != 0 and "--render needs a report: cannot read" in r.stderr


def test_only_refuses_a_report_of_another_profile(tiny_report):
    r = report(tiny_report, "--only", "bp_family", "--profile", "quick")
    assert r.returncode != 0 and "profile 'tiny'" in r.stderr


def test_a_faster_epoch_counts_for_the_balancer_only_if_the_shares_followed():
    sys.path.insert(0, os.path.join(ROOT, "perf"))
    from report import balancing_helped

    def bal(ratio, follow, epoch=0):
        return {"ratios": {"epoch_time_load_over_static": ratio},
                "load": {"rounds_to_follow": follow, "epoch_followed": None if follow is None else epoch}}
    assert balancing_helped(bal([0.79], 12))
    assert not balancing_helped(bal([0.79], None))       # the shares never moved: not the balancer's doing
    assert not balancing_helped(bal([0.85], 12))
    assert not balancing_helped(bal([], 12))
    assert not balancing_helped(bal([0.79], 12, epoch=None))   # a run that does not say when: no verdict on it


# the share log of the committed full report (session 8): shares already leaned off w0 (it hosts
# the spout and the sync) before the co-tenant came to w0's core at t=2.05 s, step 79
FULL_LOG = [{"step": 22, "epoch": 0, "t": 1.26, "shares": [1.205, 0.795]},
            {"step": 253, "epoch": 2, "t": 5.05, "shares": [1.337, 0.663]},
            {"step": 382, "epoch": 3, "t": 7.02, "shares": [1.052, 0.948]}]


def _share_response(*args):
    sys.path.insert(0, os.path.join(ROOT, "perf"))
    from balance import share_response
    return share_response(*args)


def test_the_shares_followed_when_they_moved_work_off_the_loaded_unit():
    r = _share_response(FULL_LOG, (2.05, 75, 79), (6.17, 319, 327))
    assert r["settled_shares"] == [1.337, 0.663]
    assert (r["rounds_to_follow"], r["seconds_to_follow"], r["epoch_followed"]) == (174, 3.0, 2)
    assert r["rounds_to_first_change"] == 174
    assert (r["rounds_to_return"], r["seconds_to_return"]) == (55, 0.85)


def test_the_shares_mostly_held_under_the_co_tenant_are_a_second_reference():
    # followed at step 85, held 8 s; a small change just before the stop: the shares in force
    # at the stop were not where they mostly were
    log = [{"step": 85, "t": 4.0, "shares": [1.443, 0.557]}, {"step": 296, "t": 12.1, "shares": [1.38, 0.62]}]
    r = _share_response(log, (3.7, 59, 79), (12.3, 297, 300))
    assert r["settled_shares"] == [1.38, 0.62] and r["rounds_to_follow"] == 217     # 0.557 is 10.2 % off 0.62
    assert r["median_shares"] == [1.443, 0.557] and r["rounds_to_median"] == 6
    r = _share_response(FULL_LOG, (2.05, 75, 79), (6.17, 319, 327))
    assert r["median_shares"] == [1.205, 0.795] and r["rounds_to_median"] is None   # mostly as before it


def test_shares_that_never_moved_off_the_loaded_unit_did_not_follow():
    before_only = FULL_LOG[:1]
    r = _share_response(before_only, (2.05, 75, 79), (6.17, 319, 327))
    assert r["rounds_to_follow"] is None and r["rounds_to_first_change"] is None
    toward = [FULL_LOG[0], {"step": 253, "t": 5.05, "shares": [0.9, 1.1]}]     # more work to the loaded unit
    r = _share_response(toward, (2.05, 75, 79), (6.17, 319, 327))
    assert r["rounds_to_first_change"] == 174 and r["rounds_to_follow"] is None
    assert _share_response([], (2.05, 75, 79), None)["rounds_to_follow"] is None


def test_a_gain_counts_for_the_balancer_only_if_the_shares_followed_within_the_epochs_compared():
    sys.path.insert(0, os.path.join(ROOT, "perf"))
    from report import balancing_helped, cotenant_verdict

    def section(epoch_followed):
        load = {"epoch_s": [2.04, 1.99, 1.88, 1.9], "rounds_to_follow": 174, "seconds_to_follow": 3.0,
                "epoch_followed": epoch_followed, "rounds_to_first_change": 174}
        return {"spread": 1.87, "balance": {"ratios": {"epoch_time_load_over_static": [0.79],
                                                       "accuracy_load_minus_static_pp": 0.2}, "load": load}}
    assert balancing_helped(section(1)["balance"])          # followed during epoch 2, the one compared
    late = section(2)
    assert not balancing_helped(late["balance"])
    assert cotenant_verdict(late).startswith("holds partly")       # the allocations differ (1.87x)
    assert "in epoch 3, after the epochs compared (2): those ran with the shares set before it" in \
        cotenant_verdict(late)
    late["spread"] = 1.0           # neither part holds: the verdict could not say so before
    assert cotenant_verdict(late).startswith("does not hold here")
    helped = section(1)
    assert cotenant_verdict(helped).startswith("holds:")
    helped["spread"] = 1.05
    assert cotenant_verdict(helped).startswith("holds partly")


def test_the_loaded_node_verdict_says_when_the_shares_followed_after_the_epochs_compared():
    """Section 2 credited a faster epoch under the co-tenant to the balancer although the
    shares had moved only after it; section 4 said so, section 2 did not."""
    sys.path.insert(0, os.path.join(ROOT, "perf"))
    from report import loaded_node
    load = {"epoch_s": [2.04, 1.99, 1.88, 1.9], "rounds_to_follow": 174, "seconds_to_follow": 3.0,
            "epoch_followed": 2, "rounds_to_first_change": 174, "rounds_to_return": 55}
    report = {"recovery": {"failure_ok": True, "verdict": "holds: a node failure: fine; a loaded node: x"},
              "threads": {"balance": {"ratios": {"epoch_time_load_over_static": [0.79]}, "load": load}}}
    loaded_node(report)
    assert report["recovery"]["verdict"].startswith("holds partly: a node failure: fine; a loaded node (section 4)")
    assert report["recovery"]["verdict"].endswith("after the epochs compared (2): those ran with the shares set "
                                                  "before it")


def test_the_allocations_compared_are_the_same_two_threads_given_two_ways():
    """Rows with one thread or another batch differ for reasons other than allocation:
    only the two ways of giving the same 2 threads to the work are compared."""
    sys.path.insert(0, os.path.join(ROOT, "perf"))
    from report import allocation_spread, threads_verdict
    th = {"1 unit, batch 64, 1 thread": 27000.0, "1 unit, batch 64, its step on 2 threads": 40000.0,
          "1 unit, batch 32, 1 thread": 26000.0, "2 units, batch 32, 2 threads, one each": 50000.0}
    assert allocation_spread(th) == 1.25                # not 50000 / 26000
    th["spread"] = allocation_spread(th)
    assert threads_verdict(th).startswith("holds partly: allocations differ by 1.25x")
    assert allocation_spread({"1 unit, batch 64, 1 thread": 1.0}) is None
    assert threads_verdict({"spread": None}).startswith("does not hold here: the allocations were not both measured")
