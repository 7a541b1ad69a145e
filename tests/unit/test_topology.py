import json
import re

import msgpack
import pytest

from streamnet.examples import wordcount
from streamnet.runtime import TopologyBuilder, TopologyError
from streamnet.runtime.topology import Topology

SPOUT = "streamnet.examples.wordcount:SentenceSpout"
SPLIT = "streamnet.examples.wordcount:SplitBolt"
COUNT = "streamnet.examples.wordcount:CountBolt"


def test_round_trips_through_json_and_msgpack():
    t = wordcount.topology(count=10)
    for data in (json.loads(json.dumps(t.to_dict())), msgpack.unpackb(msgpack.packb(t.to_dict()))):
        u = Topology.from_dict(data, check_classes=True)
        assert u.to_dict() == t.to_dict()
        assert u.describe() == t.describe()


def test_task_numbering_and_describe():
    t = wordcount.topology(split=2, counters=3)
    assert [list(t.tasks(c)) for c in ("sentences", "split", "count")] == [[0], [1, 2], [3, 4, 5]]
    text = t.describe()
    assert "bolt  count" in text and "<- split [fields(word)]" in text and "(6 tasks)" in text


def test_unknown_component_says_what_is_known():
    b = TopologyBuilder("t")
    b.add_spout("data", SPOUT)
    b.add_bolt("sync", SPLIT).shuffle("compute2")
    with pytest.raises(TopologyError, match="bolt 'sync' subscribes to unknown component 'compute2'; known: data, sync"):
        b.build()


def test_duplicate_ids_and_bad_parallelism():
    b = TopologyBuilder("t")
    b.add_spout("a", SPOUT)
    with pytest.raises(TopologyError, match="duplicate component id 'a'"):
        b.add_bolt("a", SPLIT)
    with pytest.raises(TopologyError, match="parallelism must be an integer >= 1; got 0"):
        b.add_bolt("b", SPLIT, parallelism=0)


def test_cycles_need_consent():
    b = TopologyBuilder("t")
    b.add_spout("s", SPOUT)
    b.add_bolt("x", SPLIT).shuffle("s").shuffle("y")
    b.add_bolt("y", SPLIT).shuffle("x")
    with pytest.raises(TopologyError, match="cycle"):
        b.build(check_classes=False)
    assert b.build(allow_cycles=True, check_classes=False).num_tasks == 3


def test_fields_grouping_checks_declared_fields():
    b = TopologyBuilder("t")
    b.add_spout("s", SPOUT)
    b.add_bolt("x", COUNT).fields("s", "word")
    with pytest.raises(TopologyError, match=r"groups by \['word'\] but 's' declares fields \['sid', 'sentence'\]"):
        b.build()


def test_bad_class_paths():
    b = TopologyBuilder("t")
    b.add_spout("s", "streamnet.examples.wordcount.SentenceSpout")
    with pytest.raises(TopologyError, match="must be 'package.module:Class'"):
        b.build()
    b = TopologyBuilder("t")
    b.add_spout("s", "streamnet.examples.wordcount:SplitBolt")
    with pytest.raises(TopologyError, match="is not a Spout subclass"):
        b.build()
    b = TopologyBuilder("t")
    b.add_spout("s", "no.such.module:X")
    with pytest.raises(TopologyError, match="cannot import"):
        b.build()


def test_unknown_setting_and_no_spout():
    b = TopologyBuilder("t")
    b.add_spout("s", SPOUT)
    with pytest.raises(TopologyError, match="unknown topology setting"):
        b.build(max_pending=3)
    b = TopologyBuilder("t")
    b.add_bolt("x", SPLIT)
    with pytest.raises(TopologyError, match="has no spout"):
        b.build()


@pytest.mark.parametrize("setting,value", [("max_spout_pending", 0), ("max_spout_pending", 2.5),
                                           ("queue_size", 0), ("queue_size", "big"), ("queue_size", True),
                                           ("message_timeout_s", -1), ("message_timeout_s", float("nan"))])
def test_engine_settings_it_cannot_run_with_are_refused_when_the_spec_is_parsed(setting, value):
    b = TopologyBuilder("t")
    b.add_spout("s", SPOUT)
    with pytest.raises(TopologyError, match=f"{setting} must be"):
        b.build(**{setting: value})
    good = b.build().to_dict()
    with pytest.raises(TopologyError, match=f"{setting} must be"):    # as a worker or the scheduler reads it
        Topology.from_dict(dict(good, config=dict(good["config"], **{setting: value})))


def test_a_topology_of_more_tasks_than_an_assignment_can_hold_is_refused():
    from streamnet.runtime.topology import MAX_TASKS
    b = TopologyBuilder("t")
    b.add_spout("s", SPOUT, parallelism=MAX_TASKS)
    assert b.build().num_tasks == MAX_TASKS
    b.add_bolt("x", SPLIT, parallelism=1).shuffle("s")
    with pytest.raises(TopologyError, match=f"has {MAX_TASKS + 1} tasks; at most {MAX_TASKS}"):
        b.build()


@pytest.mark.parametrize("name,says", [
    ("a/b", "cannot hold '/'"), ("..", "cannot be '..'"), ("", "must be 1 to 200 characters"),
    ("x" * 201, "must be 1 to 200 characters; got 201"), ("a\nb", "cannot hold '\\n'"), (5, "must be a string; got 5"),
])
def test_a_topology_name_is_one_zookeeper_node(name, says):
    """The name is a node under topologies/: 'a/b' would be a deeper path, and 5 (from
    `--set name=5`) raised a TypeError."""
    with pytest.raises(TopologyError, match="a topology's name " + re.escape(says)):
        TopologyBuilder(name)
    with pytest.raises(TopologyError, match=re.escape(says)):
        Topology.from_dict({"name": name, "components": [], "config": {}})
