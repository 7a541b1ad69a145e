"""`make report`'s machinery on a tiny configuration (synthetic data, embedded cluster):
every section, figure and number is written."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytest.importorskip("matplotlib")


def test_the_report_has_every_section_figure_and_verdict(tmp_path):
    out = tmp_path / "report"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "perf", "report.py"), "--profile", "tiny",
                        "--dataset", "synthetic", "--out", str(out)], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
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
