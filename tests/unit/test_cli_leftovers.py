"""streamnet-ui's usage errors and --version, and a bad $STREAMNET_ZK named as the
variable: one line, exit 2, nothing contacted (issue 14's leftovers from part 4)."""
import subprocess
import sys

import pytest

from streamnet.cli import submit, worker
from streamnet.cli.common import error_exit
from streamnet.runtime.control import TopologyFailed
from streamnet.runtime.control.coordinator import ConnectionLostError
from streamnet.errors import StreamnetError
from streamnet.ui import cli as ui

from tests.unit.test_cli_mistakes import UNREACHABLE_ZK, one_line_error, run_main


@pytest.mark.parametrize("argv,says", [
    (["--port", "-5"], "argument --port: must be from 0 to 65535"),
    (["--poll", "0"], "argument --poll: must be a finite number > 0"),
    (["--log-level", "verbose"], "argument --log-level: invalid choice: 'VERBOSE'"),
    (["--zk", "host:abc"], "argument --zk: 'host:abc' is not HOST:PORT"),
])
def test_ui_usage_errors_are_one_line(argv, says, capsys):
    assert run_main(ui.main, ["--zk", UNREACHABLE_ZK] + argv) == 2
    line = one_line_error(capsys, "streamnet-ui")
    assert says in line and "see streamnet-ui --help" in line


def test_ui_version_and_environment_in_help(capsys):
    r = subprocess.run([sys.executable, "-m", "streamnet.ui.cli", "--version"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("streamnet-ui "), r.stderr
    assert run_main(ui.main, ["--help"]) == 0
    assert "STREAMNET_ZK" in capsys.readouterr().out


@pytest.mark.parametrize("main,prog,argv", [
    (submit.main, "streamnet-submit", ["list"]),
    (submit.main, "streamnet-submit", ["submit", "wordcount"]),
    (worker.main, "streamnet-worker", []),
    (ui.main, "streamnet-ui", []),
])
def test_a_bad_streamnet_zk_is_named_as_the_variable(main, prog, argv, monkeypatch, capsys):
    monkeypatch.setenv("STREAMNET_ZK", "zk1:2181,zk2:abc")
    assert run_main(main, argv) == 2
    line = one_line_error(capsys, prog)
    assert "$STREAMNET_ZK: 'zk2:abc' is not HOST:PORT" in line, line
    assert "argument --zk" not in line


def test_a_flag_wins_over_a_bad_streamnet_zk(monkeypatch):
    monkeypatch.setenv("STREAMNET_ZK", "zk1:abc")
    assert submit.build_parser().parse_args(["list", "--zk", UNREACHABLE_ZK]).zk == UNREACHABLE_ZK


def test_exit_codes_of_errors(capsys):
    assert error_exit("p", StreamnetError("usage")) == 2
    assert error_exit("p", ConnectionLostError("no quorum")) == 1
    assert error_exit("p", TopologyFailed("topology 'x' failed: bolt 'b' (task 1) ...")) == 1
    assert capsys.readouterr().err.splitlines()[-1] == "p: error: topology 'x' failed: bolt 'b' (task 1) ..."



def test_worker_exits_1_when_the_ensemble_is_out_of_reach_and_2_for_a_mistake(tmp_path, capsys):
    """systemd restarts a worker on exit 1 (ZooKeeper not up yet at boot) but not on
    exit 2 (RestartPreventExitStatus=2: a mistake in its settings would only loop)."""
    from streamnet.cli.common import write_secret
    secret = str(tmp_path / "secret")
    write_secret(secret)
    argv = ["--zk", UNREACHABLE_ZK, "--secret-file", secret, "--session-timeout", "1", "--port", "0"]
    assert run_main(worker.main, argv) == 1
    line = one_line_error(capsys, "streamnet-worker")
    assert "ZooKeeper is unreachable (0 of 1 server reachable)" in line
    assert run_main(worker.main, argv[:2] + ["--secret-file", str(tmp_path / "absent")]) == 2
    assert "does not exist" in one_line_error(capsys, "streamnet-worker")
