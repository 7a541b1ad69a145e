"""Keyed checkpoints: a MAC with a key derived from the cluster secret; old ones removed."""
import hashlib
import os

import msgpack
import numpy as np
import pytest

from streamnet.training import checkpoint as ck
from streamnet.training.checkpoint import (CheckpointError, checkpoint_key, clean_up, latest_checkpoint,
                                          list_checkpoints, load_checkpoint, write_checkpoint)

KEY = checkpoint_key(b"s" * 32)


def _forge(path: str, new_params: np.ndarray) -> None:
    """What someone who can write the directory but lacks the secret can do: change the
    body and put its right SHA-256 in the header, keeping the old MAC."""
    raw = open(path, "rb").read()
    head, _, body = raw.partition(b"\n")[2].partition(b"\n")
    doc = msgpack.unpackb(body, raw=False)
    doc["params"]["__nd__"][2] = np.asarray(new_params, np.float32).tobytes()
    body = msgpack.packb(doc, use_bin_type=True)
    sha, _, mac = head.partition(b" ")
    new_head = hashlib.sha256(body).hexdigest().encode() + (b" " + mac if mac else b"")
    open(path, "wb").write(raw[:6] + new_head + b"\n" + body)


def test_a_keyed_checkpoint_round_trips_and_a_forged_one_is_refused(tmp_path):
    p = np.arange(8, dtype=np.float32)
    ptr = write_checkpoint(str(tmp_path), "run", 1, p, {"position": {}}, key=KEY)
    got = load_checkpoint(ptr["path"], ptr["sha256"], key=KEY)
    np.testing.assert_array_equal(got["params"], p)
    assert got["authenticated"] is True
    _forge(ptr["path"], np.full(8, 1e30))
    with pytest.raises(CheckpointError, match="changed by someone without the cluster secret"):
        load_checkpoint(ptr["path"], key=KEY)
    with pytest.raises(CheckpointError, match="run-00000001.ckpt"):
        load_checkpoint(ptr["path"], key=KEY)


def test_another_clusters_key_and_unkeyed_files_are_refused_by_a_keyed_reader(tmp_path):
    other = write_checkpoint(str(tmp_path), "a", 1, np.ones(4, np.float32), key=checkpoint_key(b"o" * 32))
    with pytest.raises(CheckpointError, match="its MAC does not match"):
        load_checkpoint(other["path"], key=KEY)
    plain = write_checkpoint(str(tmp_path), "b", 1, np.ones(4, np.float32))       # no key in this process
    assert open(plain["path"], "rb").read(6) == b"SNCK2\n"
    assert load_checkpoint(plain["path"])["authenticated"] is False
    with pytest.raises(CheckpointError, match="not authenticated"):
        load_checkpoint(plain["path"], key=KEY)
    # without the key, a keyed file is checked by its SHA-256 only (the workers check the MAC)
    assert load_checkpoint(other["path"])["authenticated"] is False


def test_the_process_key_signs_and_verifies_by_default_within_its_block(tmp_path):
    assert ck._cluster_key is None
    with ck.signing_with(b"s" * 32):
        ptr = write_checkpoint(str(tmp_path), "run", 3, np.ones(4, np.float32), {"position": {}})
        assert load_checkpoint(ptr["path"], key=KEY)["step"] == 3
        _forge(ptr["path"], np.zeros(4))
        good = write_checkpoint(str(tmp_path), "run", 2, np.ones(4, np.float32), {"position": {}})
        path, got = latest_checkpoint(str(tmp_path), "run")     # the forged newest is refused, the previous used
        assert path == good["path"] and got["step"] == 2
    assert ck._cluster_key is None


def test_resume_refuses_a_forged_checkpoint_naming_it(tmp_path):
    from streamnet.training.config import SETUPS, with_overrides
    from streamnet.training.nsmap import resume_point
    cfg = with_overrides(SETUPS["lenet5-mixbp"](), {"epochs": 2})
    from streamnet.training.config import run_config_to_dict
    state = {"config": run_config_to_dict(cfg), "position": {"step": 4, "epoch": 1, "round": 2}}
    with ck.signing_with(b"s" * 32):
        ptr = write_checkpoint(str(tmp_path), "run", 4, np.ones(4, np.float32), state)
        assert resume_point(cfg, str(tmp_path), "run")["step"] == 4
        _forge(ptr["path"], np.zeros(4))
        with pytest.raises(CheckpointError, match="run-00000004.ckpt was changed by someone without the cluster "
                                                  "secret"):
            resume_point(cfg, None, "run", ptr["path"])


def test_each_write_keeps_the_newest_n_and_the_one_just_written(tmp_path):
    d = str(tmp_path)
    for step in range(1, 6):
        write_checkpoint(d, "run", step, np.ones(2, np.float32), keep=3)
    write_checkpoint(d, "other", 1, np.ones(2, np.float32), keep=3)
    assert [s for s, _ in list_checkpoints(d, "run")] == [5, 4, 3]
    # a run resumed from step 2 writes below the newest: what it wrote stays
    write_checkpoint(d, "run", 2, np.ones(2, np.float32), keep=2)
    assert [s for s, _ in list_checkpoints(d, "run")] == [5, 2]
    write_checkpoint(d, "run", 6, np.ones(2, np.float32), keep=0)          # 0 keeps all
    assert [s for s, _ in list_checkpoints(d, "run")] == [6, 5, 2]
    assert [s for s, _ in list_checkpoints(d, "other")] == [1]


def test_stale_temporary_files_are_removed_and_fresh_ones_kept(tmp_path):
    stale, fresh = tmp_path / ".run-dead.tmp", tmp_path / ".run-writing.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    old = os.stat(stale).st_mtime - ck.STALE_TMP_S - 60
    os.utime(stale, (old, old))
    write_checkpoint(str(tmp_path), "run", 1, np.ones(2, np.float32))
    assert not stale.exists() and fresh.exists()
    assert clean_up(str(tmp_path), "run") == []


def test_keep_checkpoints_reaches_the_checkpoint_bolt_which_removes_older_ones(tmp_path):
    from streamnet.errors import ConfigError
    from streamnet.training.checkpoint_bolt import CheckpointBolt
    from streamnet.training.config import SETUPS, with_overrides
    from streamnet.training.nsmap import BUILDERS, build_topology
    cfg = with_overrides(SETUPS["lenet5-mixbp"](), {"dataset": "synthetic", "train_limit": 64, "test_limit": 32})

    def bolt_config(**kw):
        topo = build_topology(cfg, checkpoint_dir=str(tmp_path), **kw)
        return next(c for c in topo.components if c["id"] == "checkpoint")["config"]
    assert bolt_config()["keep"] == ck.DEFAULT_KEEP and bolt_config(keep_checkpoints=0)["keep"] == 0
    with pytest.raises(ConfigError, match="keep_checkpoints: must be an integer >= 0"):
        bolt_config(keep_checkpoints=-1)
    topo, _ = BUILDERS["lenet5-mixbp"](checkpoint_dir=str(tmp_path), keep_checkpoints=2, dataset="synthetic",
                                       train_limit=64, test_limit=32)
    config = next(c for c in topo.components if c["id"] == "checkpoint")["config"]
    assert config["keep"] == 2

    class Ctx:
        topology = "run"

        async def compute(self, fn, *args):
            return fn(*args)

        def put_checkpoint(self, pointer):
            pass

        async def save_state_async(self, state):
            pass

        def component_tasks(self, component):    # one sync task: every checkpoint comes whole
            return [3]

    class Collector:
        def ack(self, tup):
            pass
    bolt = CheckpointBolt(**config)
    bolt.prepare(Ctx(), Collector())
    import asyncio
    for step in range(1, 5):
        asyncio.run(bolt.execute({"step": step, "epoch": 1, "slice": 0, "params": np.ones(3, np.float32),
                                   "state": None}))
    assert [s for s, _ in list_checkpoints(str(tmp_path), "run")] == [4, 3]


def test_a_checkpoint_renamed_to_another_run_or_step_is_refused(tmp_path):
    """The MAC covers the body, not the file's name: the name and step inside it are
    checked against the name, so a good checkpoint cannot stand for another run or step."""
    d = str(tmp_path)
    with ck.signing_with(b"s" * 32):
        a = write_checkpoint(d, "a", 5, np.zeros(4, np.float32), {"position": {}})
        write_checkpoint(d, "b", 3, np.ones(4, np.float32), {"position": {}})
        os.replace(a["path"], ck.checkpoint_path(d, "b", 7))       # a's, as the newest of b
        with pytest.raises(CheckpointError, match=r"holds run 'a''s step 5, not run 'b''s step 7"):
            load_checkpoint(ck.checkpoint_path(d, "b", 7))
        path, got = latest_checkpoint(d, "b")                        # b's own, the one before
        assert path == ck.checkpoint_path(d, "b", 3) and got["step"] == 3
        np.testing.assert_array_equal(got["params"], np.ones(4, np.float32))
        os.replace(path, ck.checkpoint_path(d, "b", 9))             # b's own, as a later step
        with pytest.raises(CheckpointError, match=r"holds run 'b''s step 3, not run 'b''s step 9"):
            load_checkpoint(ck.checkpoint_path(d, "b", 9))
        os.replace(ck.checkpoint_path(d, "b", 9), os.path.join(d, "exported.ckpt"))
        assert load_checkpoint(os.path.join(d, "exported.ckpt"))["step"] == 3   # a name of a user's own


def test_a_run_does_not_list_the_checkpoints_of_a_run_whose_name_holds_its_own(tmp_path):
    """`run-foo-run-00000001.ckpt` is run "run-foo-run"'s: the file name's own run, not a
    search for "run-<step>" at its end, says whose it is."""
    d = str(tmp_path)
    with ck.signing_with(b"s" * 32):
        write_checkpoint(d, "run-foo-run", 1, np.zeros(4, np.float32), {"position": {}})
        assert list_checkpoints(d, "run") == []
        with pytest.raises(CheckpointError, match="no checkpoint of 'run'"):
            latest_checkpoint(d, "run")
        assert [step for step, _ in list_checkpoints(d, "run-foo-run")] == [1]


def test_submit_resume_skips_a_newest_checkpoint_without_the_mac_also_when_it_builds_again(tmp_path, monkeypatch):
    """`submit --resume` builds its topology twice (the second time for the cluster's default
    sync tasks): the second build ran without the secret and took the newest checkpoint
    whatever its MAC, which the workers then refused, failing the run, where README says
    the one before it is used."""
    from streamnet.cli import cluster_commands, submit
    from streamnet.cli.common import read_secret, write_secret
    from streamnet.runtime.control.cluster_state import ClusterState
    from streamnet.runtime.control.inprocess import InProcessServer
    from streamnet.runtime.control.roles import parse
    from streamnet.training.config import run_config_to_dict
    from streamnet.training.nsmap import default_name, run_config_of
    secret_file, ckdir = str(tmp_path / "secret"), str(tmp_path / "ck")
    write_secret(secret_file)
    argv = ["submit", "lenet5-mixbp", "--dataset", "synthetic", "--secret-file", secret_file,
            "--zk", "127.0.0.1:1", "--cluster", "c"]
    topo, _ = cluster_commands.build_topology("lenet5-mixbp", {"dataset": "synthetic"})
    cfg = run_config_of(topo)
    state = {"config": run_config_to_dict(cfg), "position": {"step": 10, "epoch": 1, "round": 0}}
    signed = write_checkpoint(ckdir, default_name(cfg), 10, np.ones(4, np.float32), state,
                              key=checkpoint_key(parse(read_secret(secret_file))[1]))
    write_checkpoint(ckdir, default_name(cfg), 20, np.ones(4, np.float32), dict(state, position={
        "step": 20, "epoch": 1, "round": 5}))         # newer, written without the cluster's key
    server = InProcessServer()
    try:
        cluster = ClusterState(server.session(), "c")
        for w in ("w0", "w1"):
            cluster.register_worker(w, {"host": "127.0.0.1", "port": 1})
        monkeypatch.setattr(cluster_commands, "connect", lambda a: (server.session(), cluster, None))
        assert submit.main(argv + ["--resume", "--checkpoint-dir", ckdir]) == 0
        spec = cluster.topology(default_name(cfg))
    finally:
        server.shutdown()
    sync = next(c for c in spec["components"] if c["id"] == "sync")
    assert sync["config"]["resume"]["path"] == signed["path"] and sync["parallelism"] == 2
