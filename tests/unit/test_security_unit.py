"""The systemd unit (issue 15): hardened to an exposure of 3 or less, a stop
timeout longer than the worker's stop grace, descriptors for its connection cap."""
import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from streamnet.cli.worker import build_parser
from streamnet.runtime.dataplane.guard import MAX_CONNECTIONS

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "streamnet-worker.service"


def _service() -> dict:
    p = configparser.ConfigParser(strict=False, interpolation=None)
    p.optionxform = str
    p.read_string(UNIT.read_text())
    return dict(p["Service"])


def test_stop_timeout_and_descriptors():
    s = _service()
    grace = build_parser().parse_args(["--zk", "z:1"]).stop_grace
    assert float(s["TimeoutStopSec"]) > grace
    assert int(s["LimitNOFILE"]) >= 2 * MAX_CONNECTIONS
    assert "MemoryDenyWriteExecute" not in s         # numba needs executable memory it writes


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_exposure_is_at_most_3(tmp_path):
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text())
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout + r.stderr)
    if m is None:
        pytest.skip(f"this systemd-analyze cannot score unit files offline: {r.stderr[:200]}")
    assert float(m.group(1)) <= 3.0, r.stdout


def test_the_workers_command_parses_and_bounds_checkpoints_to_its_state_directory(monkeypatch):
    # a submitter names the checkpoint directory; the unit keeps the worker's writes in the
    # one place it may write (StateDirectory), and the command is one the worker takes
    import os
    import shlex
    s = _service()
    env = dict(v.split("=", 1) for v in shlex.split(s["Environment"]))
    monkeypatch.setenv("STREAMNET_CHECKPOINT_ROOT", env["STREAMNET_CHECKPOINT_ROOT"])
    line = re.sub(r"\$\{(\w+)\}", lambda m: {"STREAMNET_PORT": "7700", "STREAMNET_THREADS": "2",
                                              "STREAMNET_LOG_LEVEL": "INFO"}.get(m[1], "x"),
                  s["ExecStart"].replace("\\\n", " "))
    argv = shlex.split(line)
    assert argv[0].endswith("/streamnet-worker")
    a = build_parser().parse_args(argv[1:])
    state = "/var/lib/" + s["StateDirectory"]
    assert a.checkpoint_root and os.path.commonpath([a.checkpoint_root, state]) == state
