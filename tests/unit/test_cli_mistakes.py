"""Each user mistake of issue 14 part 4: one line on stderr naming the program, exit 2,
no traceback; none of these needs ZooKeeper (they are refused before connecting)."""
import os
import select
import subprocess
import sys
import time

import pytest

from streamnet.cli import submit, worker
from streamnet.runtime import wait_for
from streamnet.ui import cli as ui

UNREACHABLE_ZK = "127.0.0.1:1"      # never contacted: each mistake is caught before connecting


def one_line_error(capsys, prog: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}") and ": error: " in lines[0], err
    assert "Traceback" not in err
    return lines[0]


def read_line(pipe, buf: bytearray, deadline: float, what: str) -> str:
    """The next line a child writes to `pipe` ("" at its end; a progress bar's "\\r" ends
    one too, as in a text-mode readline), waited for until `deadline` (time.monotonic())
    even when the child is alive and silent: AssertionError naming `what` after it. `buf`
    keeps what was read past the line; read the rest with buf.decode() +
    p.communicate()[i] (nothing here reads through the pipe's file object)."""
    fd = pipe.fileno()
    while b"\n" not in buf and b"\r" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out waiting for {what}; last read: {bytes(buf)!r}")
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                line = buf.decode()
                buf.clear()
                return line
            buf += chunk
    end = min(i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0)
    line = buf[:end].decode()
    del buf[:end + 1]
    return line + "\n"


def run_main(main, argv):
    """main(argv), whether it returns the code or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("main,prog,argv", [
    (submit.main, "streamnet-submit", ["--log-level", "verbose", "list", "--zk", UNREACHABLE_ZK]),
    (worker.main, "streamnet-worker", ["--log-level", "verbose", "--zk", UNREACHABLE_ZK]),
])
def test_log_level_lists_the_choices(main, prog, argv, capsys):
    assert run_main(main, argv) == 2
    line = one_line_error(capsys, prog)
    assert "--log-level" in line and "DEBUG" in line and "WARNING" in line


def test_log_level_any_case_is_accepted(capsys):
    assert submit.build_parser().parse_args(["--log-level", "debug", "list"]).log_level == "DEBUG"


def test_zk_port_not_a_number(capsys):
    assert run_main(submit.main, ["list", "--zk", "host:abc"]) == 2
    assert "argument --zk: 'host:abc' is not HOST:PORT" in one_line_error(capsys, "streamnet-submit")


@pytest.mark.parametrize("argv,says", [
    (["--port", "-5"], "argument --port: must be from 0 to 65535"),
    (["--threads", "0"], "argument --threads: must be an integer >= 1; got 0"),
    (["--zk", "zk1:2181,zk2:x"], "argument --zk: 'zk2:x' is not HOST:PORT"),
    (["--session-timeout", "inf"], "argument --session-timeout: must be a finite number > 0; got inf"),
    # a worker's id is one node under workers/: 'rack1/w1' made a node 'rack1' that
    # every listing took for a worker, and the leader placed nothing any more
    (["--name", "rack1/w1"], "argument --name: cannot hold '/'; got 'rack1/w1'"),
    (["--name", ".."], "argument --name: cannot be '..'"),
    (["--name", "wé"], "argument --name: must be ASCII; got 'wé'"),
    (["--name", ""], "argument --name: must be 1 to 200 characters; got 0"),
    (["--threads", "5000"], "argument --threads: must be at most 1024; got 5000"),   # all started at once
    # peers would dial 0.0.0.0: their own machine
    (["--host", "0.0.0.0"], "--host 0.0.0.0 listens on every address; give --advertise-host"),
])
def test_worker_numbers_checked_before_connecting(argv, says, capsys):
    # no --secret-file either: the flag is refused before the secret or ZooKeeper is looked at
    assert run_main(worker.main, ["--zk", UNREACHABLE_ZK] + argv) == 2
    assert says in one_line_error(capsys, "streamnet-worker")


@pytest.mark.parametrize("argv,says", [
    (["run-example", "wordcount", "--set", "count"], "--set takes KEY=VALUE; got 'count'"),
    (["run-example", "wordcount", "--set", "count=abc"], "--set count takes an integer; got 'abc'"),
    (["describe", "wordcount", "--set", "count=abc"], "--set count takes an integer; got 'abc'"),
    (["rebalance", "t", "--parallelism", "compute", "--zk", UNREACHABLE_ZK],
     "--parallelism takes COMPONENT=N; got 'compute'"),
    (["rebalance", "t", "--threads", "w1", "--zk", UNREACHABLE_ZK], "--threads takes WORKER=N; got 'w1'"),
])
def test_set_options_one_parser(argv, says, capsys):
    assert run_main(submit.main, argv) == 2
    assert says in one_line_error(capsys, "streamnet-submit")


def test_unknown_set_option_lists_the_builders_options_too(capsys):
    assert run_main(submit.main, ["run-example", "wordcount", "--set", "bogus=1"]) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert "no option 'bogus'" in line
    for option in ("count", "fail_every", "max_spout_pending"):
        assert option in line


def test_environment_supplies_zk(monkeypatch, capsys):
    monkeypatch.setenv("STREAMNET_ZK", UNREACHABLE_ZK)
    monkeypatch.setenv("STREAMNET_CLUSTER", "prod")
    monkeypatch.delenv("STREAMNET_SECRET_FILE", raising=False)
    a = submit.build_parser().parse_args(["list"])
    assert (a.zk, a.cluster) == (UNREACHABLE_ZK, "prod")
    assert run_main(submit.main, ["list"]) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert "--zk" not in line and "secret" in line       # got past --zk: the secret is what is missing


def test_environment_secret_file_is_read(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("STREAMNET_ZK", UNREACHABLE_ZK)
    monkeypatch.setenv("STREAMNET_SECRET_FILE", str(tmp_path / "absent"))
    assert run_main(submit.main, ["list"]) == 2
    assert f"secret file {tmp_path / 'absent'} does not exist" in one_line_error(capsys, "streamnet-submit")


def test_help_documents_the_environment(capsys):
    for main in (submit.main, worker.main):
        assert run_main(main, ["--help"]) == 0
        out = capsys.readouterr().out
        for var in ("STREAMNET_ZK", "STREAMNET_CLUSTER", "STREAMNET_SECRET_FILE"):
            assert var in out


def test_data_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "train-images-idx3-ubyte"
    f.write_bytes(b"x")
    assert run_main(submit.main, ["train", "--dataset", "mnist", "--data", str(f)]) == 2
    assert f"--data {f} is a file; give the directory" in one_line_error(capsys, "streamnet-submit")


@pytest.mark.parametrize("command", [["train", "--dataset", "synthetic"],
                                     ["submit", "wordcount", "--wait", "--zk", UNREACHABLE_ZK]])
def test_summary_path_checked_before_the_run(command, capsys):
    assert run_main(submit.main, command + ["--summary", "/no/such/dir/x.json"]) == 2
    assert "--summary /no/such/dir/x.json: directory /no/such/dir does not exist" in \
        one_line_error(capsys, "streamnet-submit")


@pytest.mark.parametrize("argv,says", [
    (["train", "--workers", "0"], "--workers must be >= 1; got 0"),
    # 300 embedded workers waited for ever on connections refused past 256 from one address
    (["train", "--workers", "300"], "--workers 300: the embedded local cluster runs at most 128 units"),
    (["train", "--batch", "0"], "--batch must be >= 1; got 0"),
    (["train", "--eval-every", "0"], "--eval-every must be >= 1; got 0"),
    (["train", "--train-limit", "0"], "--train-limit must be >= 1; got 0"),
    (["train", "--seed", "-1"], "--seed must be >= 0; got -1"),       # was numpy's ValueError, a traceback
    (["train", "--lr", "inf"], "--lr must be a finite number > 0; got inf"),
    (["describe", "lenet5-mixbp", "--set", "name=5", "--set", "dataset=synthetic"],
     "a topology's name must be a string; got 5"),
    (["train", "--momentum", "1"], "--momentum must be in [0, 1); got 1.0"),
    (["train", "--algorithm", "cumulative", "--sync-period", "4"],
     "--sync-period must be 1 for cumulative, which synchronises every step; got 4"),
    (["describe", "lenet5-mixbp", "--set", "epochs=0", "--set", "dataset=synthetic"],
     "--set epochs must be >= 1; got 0"),
    (["submit", "lenet5-mixbp", "--zk", UNREACHABLE_ZK, "--sync-tasks", "100000"],
     "--sync-tasks must be at most 61706, one slice per parameter of lenet5; got 100000"),
])
def test_validation_error_names_the_flag_first(argv, says, capsys):
    """The flag the value came from, where the configuration would name its field
    (units, train_limit, ...): the user typed the one, not the other."""
    synthetic = [] if argv[0] == "describe" else ["--dataset", "synthetic"]
    assert run_main(submit.main, argv + synthetic) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert line.startswith(f"streamnet-submit: error: {says}"), line


@pytest.mark.parametrize("prog,module", [("streamnet-submit", "streamnet.cli.submit"),
                                         ("streamnet-worker", "streamnet.cli.worker")])
def test_version(prog, module):
    r = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "STREAMNET_ZK": ""})
    assert r.returncode == 0 and r.stdout.startswith(f"{prog} ")


def test_usage_error_is_one_line_in_a_real_process():
    r = subprocess.run([sys.executable, "-m", "streamnet.cli.submit", "train", "--epochs", "x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("streamnet-submit train: error: argument --epochs")


# --- submit --wait: Ctrl-C leaves the topology running; a run stopped by SIGTERM is a failure

@pytest.fixture
def follow(monkeypatch, keep_sigterm):
    """cluster_commands._follow with the cluster calls replaced; SIGTERM's handler restored."""
    import argparse
    from types import SimpleNamespace

    from streamnet.cli import cluster_commands
    a = argparse.Namespace(zk="zk1:2181", cluster="prod", secret_file="/etc/s", timeout=5.0, summary=None,
                           metrics_log=None)

    def run(wait_done=lambda *args, **kw: None, results=None):
        monkeypatch.setattr(cluster_commands, "wait_done", wait_done)
        monkeypatch.setattr(cluster_commands, "kill_topology", lambda *args: results or {})
        return cluster_commands._follow(None, SimpleNamespace(name="t1", components=[]), None, a)
    return run


def test_ctrl_c_on_wait_says_the_topology_keeps_running(follow, capsys):
    def interrupted(*args, **kw):
        raise KeyboardInterrupt
    assert follow(wait_done=interrupted) == 130
    err = capsys.readouterr().err.strip()
    assert err == ("streamnet-submit: interrupted; t1 keeps running on cluster prod; stop it with: streamnet-submit "
                   "kill t1 --zk zk1:2181 --cluster prod --secret-file /etc/s (add --checkpoint to keep a checkpoint)")


def test_ctrl_c_names_a_root_of_its_own_and_zookeeper_tls(monkeypatch, capsys):
    import argparse
    from types import SimpleNamespace

    from streamnet.cli import cluster_commands
    a = argparse.Namespace(zk="zk1:2181", cluster="prod", secret_file=None, timeout=5.0, summary=None,
                           metrics_log=None, zk_root="/streamnet-prod", zk_tls="/etc/zk-tls")

    def interrupted(*args, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(cluster_commands, "wait_done", interrupted)
    assert cluster_commands._follow(None, SimpleNamespace(name="t1", components=[]), None, a) == 130
    assert "kill t1 --zk zk1:2181 --cluster prod --zk-root /streamnet-prod --zk-tls /etc/zk-tls (add" in \
        capsys.readouterr().err


def test_a_wait_cut_short_by_sigterm_exits_1_and_says_so(follow, capsys):
    from streamnet.training.run_stats import STOPPED_AT
    assert follow(results={STOPPED_AT: {"step": 7}}) == 1
    line = one_line_error(capsys, "streamnet-submit")
    assert "t1 was stopped before finishing" in line and "step 7" in line


def test_train_stopped_by_sigterm_exits_1(tmp_path):
    """SIGTERM to `train` on the embedded cluster: a clean stop, then exit 1 with the reason."""
    import signal
    p = subprocess.Popen([sys.executable, "-m", "streamnet.cli.submit", "train", "--dataset", "synthetic",
                          "--epochs", "200", "--workers", "2", "--batch", "8"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, buf, lines = time.monotonic() + 120, bytearray(), [None]
        while lines[-1] is None or ": round " not in lines[-1]:    # the first progress line: the run is under way
            assert lines[-1] != "", f"the run ended before its first progress line: {''.join(lines[1:])}"
            lines.append(read_line(p.stderr, buf, deadline, "the first progress line"))
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
        err = buf.decode() + err
    finally:
        p.kill()
        p.communicate(timeout=10)
    assert p.returncode == 1, err
    assert "stopped by a signal at step" in err and "Traceback" not in err


# --- with ZooKeeper

@pytest.fixture
def secret(tmp_path):
    path = str(tmp_path / "secret")
    assert submit.main(["new-secret", path]) == 0
    return path


def cluster_name(stem: str) -> str:
    """A cluster of its own per run: a cluster's nodes keep the secret of the run that made them."""
    import uuid
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def test_status_of_an_unknown_topology(zk, secret, capsys):
    cluster = cluster_name("cli-unknown")
    argv = ["status", "nosuch", "--zk", zk, "--cluster", cluster, "--secret-file", secret]
    assert submit.main(argv) == 2
    assert f"no topology 'nosuch' in cluster '{cluster}'" in one_line_error(capsys, "streamnet-submit")


def test_list_and_kill_of_a_topology_node_left_over_from_a_kill(zk, secret, capsys):
    """Two kills at once could leave a topology node holding no spec (a worker's late
    stopped mark or result made it again); `list` then failed with a TypeError traceback."""
    import argparse

    from streamnet.cli.common import connect
    cluster = cluster_name("cli-leftover")
    where = ["--zk", zk, "--cluster", cluster, "--secret-file", secret]
    coord, state, _ = connect(argparse.Namespace(zk=zk, cluster=cluster, secret_file=secret, session_timeout=10.0))
    try:
        state.mark_stopped("ghost", "w0")           # a late mark makes nothing now
        assert state.topology_names() == []
        # a late result still does: the nodes above it, holding nothing
        coord.create(state.path("topologies", "ghost", "results", "late"), b"", makepath=True)
        assert state.topology_names() == ["ghost"]
        assert submit.main(["list", *where]) == 0
        out = capsys.readouterr()
        assert "ghost" in out.out and "no spec: left over from a kill" in out.out and "Traceback" not in out.err
        assert submit.main(["kill", "ghost", *where]) == 0
        assert state.topology_names() == []
    finally:
        coord.close()


def test_duplicate_worker_name(zk, secret, capsys):
    import threading

    from streamnet.cli.common import connect
    cluster = cluster_name("cli-dup")
    cmd = ["--zk", zk, "--cluster", cluster, "--secret-file", secret, "--port", "0", "--threads", "1",
           "--name", "w1"]
    first = subprocess.Popen([sys.executable, "-m", "streamnet.cli.worker", *cmd],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import argparse
        coord, state, _ = connect(argparse.Namespace(zk=zk, cluster=cluster, secret_file=secret,
                                                     session_timeout=10.0))
        try:
            wait_for(lambda: "w1" in state.workers(), 60, "the first worker to register", interval=0.1)
        finally:
            coord.close()
        threads = {t.ident for t in threading.enumerate()}
        assert worker.main(cmd) == 2
        assert f"a worker named w1 is already registered in cluster {cluster}" in \
            one_line_error(capsys, "streamnet-worker")
        new = lambda: [t.name for t in threading.enumerate() if t.ident not in threads and t.is_alive()]  # noqa
        try:
            wait_for(lambda: not new(), 10, "the refused worker's threads to end")
        except Exception:
            raise AssertionError(f"the refused worker left threads running (its ZooKeeper client?): {new()}")
    finally:
        first.terminate()
        try:
            first.wait(30)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait(10)


def test_a_worker_restarted_after_a_crash_waits_out_its_dead_namesake(zk):
    """A worker killed with SIGKILL stays registered until its ZooKeeper session ends; the
    same worker started again meanwhile (systemd restarts it 5 s later) exited 2 - "already
    registered" - which the unit does not restart: one crash left the node down. It now
    finds that the registered one does not answer, waits for the registration to go, and
    registers."""
    from streamnet.testing import running_cluster
    with running_cluster(zk, workers=1, session_timeout=2) as (c, state):
        first_port = state.workers()["w0"]["port"]
        c.kill9("w0")
        assert "w0" in state.workers()                      # its session outlives it
        again = c.start_worker("w0")
        wait_for(lambda: state.workers().get("w0", {}).get("port") not in (None, first_port) or
                 again.poll() is not None, 90, "the restarted worker to register", interval=0.1)
        assert again.poll() is None, c.dump_logs()


@pytest.mark.parametrize("argv,says", [
    (["describe", "lenet5-mixbp", "--set", "epochs=abc"], "--set epochs takes an integer; got 'abc'"),
    (["describe", "lenet5-mixbp", "--set", "lr=x"], "--set lr takes a number; got 'x'"),
    (["submit", "lenet5-mixbp", "--set", "epochs=abc", "--zk", UNREACHABLE_ZK], "--set epochs takes an integer"),
    (["describe", "lenet5-mixbp", "--set", "foo=1"], "unknown training option(s) ['foo']; known: balance, batch,"),
    (["describe", "lenet5-mixbp", "--set", "overlap=1"], "--set overlap takes true or false; got 1"),
    (["train", "--overlap", "maybe", "--dataset", "synthetic"], "--overlap: takes on or off; got 'maybe'"),
])
def test_set_on_a_training_setup(argv, says, capsys):
    assert run_main(submit.main, argv) == 2
    assert says in one_line_error(capsys, "streamnet-submit")


def test_train_in_process_stopped_by_sigterm_says_so():
    import signal
    p = subprocess.Popen([sys.executable, "-m", "streamnet.cli.submit", "train", "--in-process", "--dataset",
                          "synthetic", "--epochs", "200", "--workers", "2", "--batch", "8"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the signal lands once the first epoch is done (training and evaluating go on):
        # a condition on the run's own progress lines, not a pause
        deadline, buf, lines = time.monotonic() + 120, bytearray(), [None]
        while lines[-1] is None or not (lines[-1].startswith("epoch 1/") and "test acc" in lines[-1]):
            assert lines[-1] != "", f"the run ended before its first epoch: {''.join(lines[1:])}"
            lines.append(read_line(p.stderr, buf, deadline, "the first epoch to finish"))
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
        err = buf.decode() + err
    finally:
        p.kill()
        p.communicate(timeout=10)
    assert p.returncode == 130, err
    assert "interrupted (Ctrl-C or SIGTERM)" in err and "Traceback" not in err


def test_alexnet_input_size_is_refused_before_the_run(capsys):
    assert run_main(submit.main, ["train", "--model", "alexnet", "--input-size", "100"]) == 2
    assert "error: --input-size must be 64 or 224 for alexnet; got 100" in one_line_error(capsys, "streamnet-submit")


def test_every_flag_has_help():
    import argparse

    def undocumented(p, path):
        for act in p._actions:
            if isinstance(act, argparse._SubParsersAction):
                for name, sub in act.choices.items():
                    yield from undocumented(sub, path + [name])
            elif not act.help:
                yield " ".join(path + [act.option_strings[0] if act.option_strings else act.dest])
    missing = list(undocumented(submit.build_parser(), ["streamnet-submit"]))
    missing += undocumented(worker.build_parser(), ["streamnet-worker"])
    missing += undocumented(ui.build_parser(), ["streamnet-ui"])
    assert not missing


def test_train_threads_takes_a_number_or_auto(capsys):
    assert run_main(submit.main, ["train", "--threads", "0", "--dataset", "synthetic"]) == 2
    assert one_line_error(capsys, "streamnet-submit").startswith(
        "streamnet-submit train: error: argument --threads: must be an integer >= 1; got 0, or 'auto'")


def _raises(exc):
    def run(a):
        raise exc
    return run


def _wrapped_interrupt():
    """What numba raises when the signal lands in its own Python code (CI saw it in
    conv2d_pool_forward's dispatcher unpickling a constant)."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as k:
            raise SystemError("CPUDispatcher(...) returned a result with an exception set") from k
    except SystemError as e:
        return e


def test_an_interrupt_wrapped_by_numba_still_exits_130(monkeypatch, capsys):
    monkeypatch.setattr(submit, "cmd_train", _raises(_wrapped_interrupt()))
    assert run_main(submit.main, ["train", "--in-process", "--dataset", "synthetic"]) == 130
    assert "streamnet-submit: interrupted (Ctrl-C or SIGTERM)" in capsys.readouterr().err


def test_an_error_not_caused_by_an_interrupt_is_not_called_one(monkeypatch):
    monkeypatch.setattr(submit, "cmd_train", _raises(SystemError("a real bug")))
    with pytest.raises(SystemError, match="a real bug"):
        submit.main(["train", "--in-process", "--dataset", "synthetic"])


@pytest.mark.parametrize("command", [["train", "--dataset", "synthetic"],
                                     ["submit", "lenet5-mixbp", "--zk", UNREACHABLE_ZK]])
def test_a_checkpoint_dir_that_is_a_file_is_refused_before_the_run(command, tmp_path, capsys):
    """Every checkpoint write failed, logged while the run went on, and a Ctrl-C then said
    there was no --checkpoint-dir."""
    f = tmp_path / "ck"
    f.write_text("")
    assert run_main(submit.main, command + ["--checkpoint-dir", str(f)]) == 2
    assert f"--checkpoint-dir {f} is a file; give a directory" in one_line_error(capsys, "streamnet-submit")


def test_a_summary_without_wait_is_refused_as_a_metrics_log_is(tmp_path, capsys):
    """Without --wait nothing follows the run to its end: the summary was silently not written."""
    for flag, says in (("--summary", "--summary needs --wait"), ("--metrics-log", "--metrics-log needs --wait")):
        argv = ["submit", "wordcount", flag, str(tmp_path / "out"), "--zk", UNREACHABLE_ZK]
        assert run_main(submit.main, argv) == 2
        assert says in one_line_error(capsys, "streamnet-submit")


@pytest.mark.parametrize("argv,says", [
    (["--cluster", "a/b"], "a cluster's name cannot hold '/'; got 'a/b'"),
    (["--cluster", ".."], "a cluster's name cannot be '..'"),
    (["--zk-root", "streamnet"], "the ZooKeeper root must be an absolute path like /streamnet; got 'streamnet'"),
    (["--zk-root", "/a//b"], "the ZooKeeper root must be an absolute path"),
])
def test_a_cluster_place_that_cannot_be_is_refused_before_connecting(argv, says, capsys):
    """Checked only once the ZooKeeper session was up: with the ensemble away the user was
    told 'unreachable' (exit 1), not what was wrong with the flag."""
    assert run_main(submit.main, ["list", "--zk", UNREACHABLE_ZK, *argv]) == 2
    assert says in one_line_error(capsys, "streamnet-submit")


def test_describe_of_a_built_in_topology_needs_no_cluster_when_one_cannot_be_reached(monkeypatch, capsys):
    """With $STREAMNET_ZK set and no secret, `describe lenet5-mixbp` failed ('a cluster secret
    is required'); it now says why it did not look for a running one and describes the
    built-in one. A name that is not built in still needs the cluster."""
    monkeypatch.setenv("STREAMNET_ZK", UNREACHABLE_ZK)
    monkeypatch.delenv("STREAMNET_SECRET_FILE", raising=False)
    assert run_main(submit.main, ["describe", "lenet5-mixbp", "--set", "dataset=synthetic"]) == 0
    out, err = capsys.readouterr()
    assert "compute" in out and "not looking for a running 'lenet5-mixbp'" in err and "secret" in err
    assert run_main(submit.main, ["describe", "mine"]) == 2
    assert "secret" in one_line_error(capsys, "streamnet-submit")


def test_status_gives_a_tasks_rate_only_over_a_measurable_busy_time():
    from streamnet.cli.cluster_commands import busy_rate
    assert busy_rate(9, 1e-6) == "busy 1 us"            # not "~9,000,000/s"
    assert busy_rate(0, 0.0) == "idle"
    assert busy_rate(500, 0.25) == "~2,000/s busy"


def test_a_batch_larger_than_a_units_part_of_the_data_is_warned_about():
    from streamnet.training import AlgorithmConfig, RunConfig
    from streamnet.training.schedule import batch_warning
    cfg = RunConfig(algorithm=AlgorithmConfig(name="mixbp", batch=1500), units=2)
    assert "batch 1500 is larger than each unit's 1,000 training samples" in batch_warning(cfg, 2000)
    assert batch_warning(cfg, 3000) is None                      # 1,500 each: one full batch
    per_unit = RunConfig(algorithm=AlgorithmConfig(name="mixbp", batch=8, unit_batches=(8, 600)), units=2)
    assert "batch 600" in batch_warning(per_unit, 1000)


def test_kill_checkpoint_says_what_became_of_the_topology():
    """A review found each of these said otherwise: a failed topology "stopped cleanly", a
    finished run "continue with --resume", a stop whose checkpoint was not written the step
    of an older checkpoint as the stop's."""
    from streamnet.cli.cluster_commands import drained_line
    from streamnet.training.run_stats import CHECKPOINTS, STOPPED_AT
    ck76 = {CHECKPOINTS: {"last": {"step": 76, "path": "/c/r-76.ckpt"}}}
    failed = drained_line("t", {"failed.3": "no", **ck76}, finished=False)
    assert failed.startswith("t could not run (failed.3); killed it without a clean stop")
    assert drained_line("t", ck76, finished=True).startswith("t had finished; nothing to stop or resume")
    late = drained_line("t", {STOPPED_AT: {"step": 179, "epoch": 9, "round": 3}, **ck76}, finished=False)
    assert late.startswith("stopped t at step 179; its checkpoint there was not written")
    assert "the newest is step 76, /c/r-76.ckpt" in late
    same = drained_line("t", {STOPPED_AT: {"step": 76, "epoch": 4, "round": 0}, **ck76}, finished=False)
    assert same == "stopped t at step 76; checkpoint /c/r-76.ckpt; continue with: streamnet-submit submit ... --resume"
    assert "writes no checkpoints" in drained_line("t", {STOPPED_AT: {"step": 5}}, finished=False)
    assert drained_line("t", {"a": 1}, finished=False) == "stopped t cleanly, every spout done; 1 results published"
