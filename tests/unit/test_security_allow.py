"""Only allowed code (issue 15): classes come from the allowed module prefixes,
checked before their module is imported, and must be the engine's kinds."""
import sys

import pytest

from streamnet.runtime.dataplane.grouping import make_chooser
from streamnet.runtime.topology import (DEFAULT_ALLOWED_MODULES, Topology, TopologyBuilder, TopologyError,
                                        module_allowed, resolve)


def popen_spec(marker: str = "/tmp/streamnet-popen-ran") -> dict:
    return {"name": "evil", "allow_cycles": False, "config": {},
            "components": [{"id": "s", "kind": "spout", "class": "subprocess:Popen", "parallelism": 1,
                            "config": {"args": ["sh", "-c", f"touch {marker}"]}, "inputs": []}]}


def popen_topology(**_):
    """For streamnet-submit: a topology function that names subprocess:Popen."""
    return Topology(popen_spec())


def test_prefixes_match_whole_module_names():
    allow = ("streamnet.examples", "mycompany.")
    assert module_allowed("streamnet.examples", allow) and module_allowed("streamnet.examples.wordcount", allow)
    assert module_allowed("mycompany.jobs", allow)
    assert not module_allowed("streamnet.examplesevil", allow) and not module_allowed("subprocess", allow)
    assert not module_allowed("streamnet", allow) and not module_allowed("subprocess", ("",))   # "" is no wildcard


def test_a_module_outside_the_prefixes_is_refused_before_it_is_imported():
    sys.modules.pop("this", None)
    with pytest.raises(TopologyError, match=r"class 'this:s' is not allowed: module 'this' is outside .*"
                                            r"--allow-module this"):
        resolve("this:s", DEFAULT_ALLOWED_MODULES)
    assert "this" not in sys.modules        # importing it would have run its code


def test_a_spec_naming_popen_is_refused_naming_the_class():
    with pytest.raises(TopologyError, match=r"spout 's': class 'subprocess:Popen' is not allowed"):
        Topology.from_dict(popen_spec(), check_classes=True, allow=DEFAULT_ALLOWED_MODULES)
    with pytest.raises(TopologyError, match=r"spout class subprocess:Popen is not a Spout subclass"):
        Topology.from_dict(popen_spec(), check_classes=True, allow=("subprocess",))


def test_allowed_modules_must_still_hold_the_engine_kinds():
    b = TopologyBuilder("t")
    b.add_spout("s", "streamnet.training.config:RunConfig")          # allowed module, not a Spout
    with pytest.raises(TopologyError, match="not a Spout subclass"):
        b.build(check_classes=False).validate(allow=DEFAULT_ALLOWED_MODULES)


def test_custom_groupings_come_from_allowed_modules_and_have_choose():
    with pytest.raises(TopologyError, match="'os:system' is not allowed"):
        make_chooser({"type": "custom", "class": "os:system"}, [1, 2], [], set(), 0, DEFAULT_ALLOWED_MODULES)
    with pytest.raises(TopologyError, match="not a class with a choose"):
        make_chooser({"type": "custom", "class": "streamnet.training.config:RunConfig"}, [1], [], set(), 0,
                     DEFAULT_ALLOWED_MODULES)
    b = TopologyBuilder("t")
    b.add_spout("s", "streamnet.examples.wordcount:SentenceSpout")
    b.add_bolt("x", "streamnet.examples.wordcount:SplitBolt").custom("s", "os:system")
    with pytest.raises(TopologyError, match="'os:system' is not allowed"):
        b.build(check_classes=False).validate(allow=DEFAULT_ALLOWED_MODULES)


def test_submit_refuses_before_writing(tmp_path, capsys):
    from streamnet.cli.submit import main
    code = main(["submit", "tests.unit.test_security_allow:popen_topology", "--zk", "127.0.0.1:1",
                 "--secret-file", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code != 0 and "would be refused by the workers" in err and "subprocess:Popen" in err
    assert "secret" not in err              # refused before it read a secret or connected anywhere


def test_worker_and_submit_take_allow_module():
    from streamnet.cli.common import allowed_modules
    from streamnet.cli.worker import build_parser
    a = build_parser().parse_args(["--zk", "z:1", "--allow-module", "a.b,c.", "--allow-module", "d"])
    assert allowed_modules(a) == ("a.b", "c.", "d")
    assert allowed_modules(build_parser().parse_args(["--zk", "z:1"])) == DEFAULT_ALLOWED_MODULES


def test_submit_checks_the_workers_list_from_the_environment(tmp_path, capsys, monkeypatch):
    from streamnet.cli.common import allowed_modules
    from streamnet.cli.submit import main
    monkeypatch.setenv("STREAMNET_ALLOW_MODULES", "streamnet.examples, mycompany.")
    assert allowed_modules() == ("streamnet.examples", "mycompany.")
    code = main(["submit", "lenet5-mixbp", "--zk", "127.0.0.1:1", "--secret-file", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code != 0 and "streamnet.training.data_spout:DataSpout' is not allowed" in err
