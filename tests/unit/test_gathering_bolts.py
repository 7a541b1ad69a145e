"""The eval and checkpoint bolts on their own, with S=2 sync tasks: a step is evaluated
or written once both slices are in, and a slice that a replay sends again afterwards
is acked at once - by this instance, and by one started anew from what this one saved
(the eval bolt's history, the checkpoint bolt's account). The evaluation split over
two eval tasks gives the one-task result, and survives a replay and bad parts."""
import asyncio
import math

import numpy as np
import pytest

from streamnet.training.checkpoint import list_checkpoints
from streamnet.training.checkpoint_bolt import CheckpointBolt
from streamnet.training.config import SETUPS, with_overrides
from streamnet.training.eval_bolt import EvalBolt
from streamnet.training.nsmap import build_topology
from streamnet.training.schedule import dataset_for, make_model
from streamnet.training.streams import EVAL_PART

CFG = with_overrides(SETUPS["lenet5-mixbp"](), {"dataset": "synthetic", "train_limit": 64, "test_limit": 32})


class Ctx:
    topology = "run"

    def __init__(self, eval_tasks=(5,), task_index=0):
        self.saved, self.published, self.pointers = None, {}, []
        self.eval_tasks, self.task_index = list(eval_tasks), task_index

    def component_tasks(self, component):
        return self.eval_tasks if component == "eval" else [3, 4]     # two sync tasks

    async def compute(self, fn, *args):
        return fn(*args)

    async def save_state_async(self, state):
        self.saved = state

    def put_checkpoint(self, pointer):
        self.pointers.append(pointer)

    def publish(self, key, value):
        self.published[key] = value

    def figure(self, *a, **k):
        pass


class Tup(dict):
    """A tuple as the bolts read it: fields by name, and its stream."""

    def __init__(self, stream, **fields):
        super().__init__(fields)
        self.stream = stream


class Collector:
    def __init__(self):
        self.acked, self.failed, self.emitted = [], [], []

    def emit(self, values, stream="default", anchors=None, direct_task=None):
        self.emitted.append((values, stream, [a["name"] for a in anchors or []], direct_task))

    def ack(self, tup):
        self.acked.append(tup["name"])

    def fail(self, tup):
        self.failed.append(tup["name"])


def _bolt(cls, cid, ctx=None, **build):
    config = next(c for c in build_topology(CFG, **build).components if c["id"] == cid)["config"]
    bolt, ctx, out = cls(**config), ctx or Ctx(), Collector()
    bolt.prepare(ctx, out)
    return bolt, ctx, out


def _eval_slice(name, s, params, epoch=1, step=23):
    half = params.size // 2 + params.size % 2          # bounds(size, 2)
    part = params[:half] if s == 0 else params[half:]
    return Tup("eval", name=name, epoch=epoch, step=step, slice=s, params=part.copy())


def test_a_late_copy_of_an_evaluated_slice_is_acked_at_once():
    params = make_model(CFG, dataset_for(CFG).num_classes).params
    bolt, ctx, out = _bolt(EvalBolt, "eval")
    run = asyncio.run
    run(bolt.execute(_eval_slice("s1 (replay of unit 0)", 1, params)))
    assert out.acked == [] and ctx.saved is None
    run(bolt.execute(_eval_slice("s0", 0, params)))
    assert sorted(out.acked) == ["s0", "s1 (replay of unit 0)"]
    assert [(h["epoch"], h["step"]) for h in ctx.saved] == [(1, 23)]
    run(bolt.execute(_eval_slice("s1 (replay of unit 1)", 1, params)))
    assert out.acked[-1] == "s1 (replay of unit 1)" and bolt.gather.parts == {}
    assert len(ctx.saved) == 1 and out.failed == []

    again, _, out2 = _bolt(EvalBolt, "eval")         # a new instance: the history tells it
    again.restore(ctx.saved)
    run(again.execute(_eval_slice("s0 (late)", 0, params)))
    assert out2.acked == ["s0 (late)"] and again.gather.parts == {}
    run(again.execute(_eval_slice("epoch 2, s1", 1, params, epoch=2, step=47)))
    assert out2.acked == ["s0 (late)"]              # a new epoch end gathers as before


def _checkpoint_part(name, s, step=24):
    state = {"position": {"epoch": 1, "round": 0, "step": step}, "outer": {"velocity": np.zeros(0, np.float32)},
             "units": {}, "counters": {}, "config": {}}
    return Tup("checkpoint", name=name, epoch=1, step=step, slice=s, params=np.full(3, s, np.float32), state=state)


def test_a_late_copy_of_a_written_checkpoints_slice_is_acked_at_once_also_after_a_restart(tmp_path):
    run, directory = asyncio.run, str(tmp_path)
    bolt, ctx, out = _bolt(CheckpointBolt, "checkpoint", checkpoint_dir=directory)
    run(bolt.execute(_checkpoint_part("s1 (replay of unit 0)", 1)))
    run(bolt.execute(_checkpoint_part("s0", 0)))
    assert sorted(out.acked) == ["s0", "s1 (replay of unit 0)"]
    assert [s for s, _ in list_checkpoints(directory, "run")] == [24] and len(ctx.pointers) == 1
    run(bolt.execute(_checkpoint_part("s1 (replay of unit 1)", 1)))
    assert out.acked[-1] == "s1 (replay of unit 1)" and bolt.gather.parts == {} and len(ctx.pointers) == 1
    assert ctx.saved == {"last": ctx.pointers[0], "errors": 0, "done": 24}

    again, ctx2, out2 = _bolt(CheckpointBolt, "checkpoint", checkpoint_dir=directory)   # from what the first saved
    again.restore(ctx.saved)
    run(again.execute(_checkpoint_part("s0 (late)", 0)))
    assert out2.acked == ["s0 (late)"] and again.gather.parts == {} and ctx2.pointers == []
    again.close()
    assert ctx2.published["checkpoints"]["last"] == ctx.pointers[0]
    run(again.execute(_checkpoint_part("s1 of the next", 1, step=48)))
    assert out2.acked == ["s0 (late)"]            # a newer checkpoint gathers as before
    assert out.failed == out2.failed == []


def _params():
    model = make_model(CFG, dataset_for(CFG).num_classes)
    return model.params + np.random.default_rng(3).normal(0, 0.05, model.num_params).astype(np.float32)


def _part_of(out, name):
    """The part a task k > 0 emitted last, as the tuple task 0 receives."""
    values, stream, anchors, direct = out.emitted[-1]
    assert stream == "part" and direct == 5, out.emitted[-1]
    return Tup("part", name=name, **dict(zip(EVAL_PART, values)))


def test_the_evaluation_split_over_two_tasks_equals_one_tasks():
    run, params = asyncio.run, _params()
    whole, ctx, _ = _bolt(EvalBolt, "eval")                        # one eval task
    for s in (0, 1):
        run(whole.execute(_eval_slice(f"s{s}", s, params)))
    (expected,) = ctx.saved
    first, ctx0, out0 = _bolt(EvalBolt, "eval", Ctx(eval_tasks=(5, 6), task_index=0))
    second, ctx1, out1 = _bolt(EvalBolt, "eval", Ctx(eval_tasks=(5, 6), task_index=1))
    assert first.shards == [(0, 16), (16, 32)] and second.shards == first.shards      # test_limit 32
    for s in (0, 1):
        run(first.execute(_eval_slice(f"to 0: s{s}", s, params)))
        run(second.execute(_eval_slice(f"to 1: s{s}", s, params)))
    assert out0.acked == [] and ctx0.saved is None               # task 0 waits for task 1's counts
    assert sorted(out1.acked) == ["to 1: s0", "to 1: s1"] and ctx1.saved is None
    part = _part_of(out1, "part of task 1")
    assert sorted(out1.emitted[-1][2]) == ["to 1: s0", "to 1: s1"]          # anchored to the slices
    assert part["task"] == 1 and part["count"] == 16
    run(first.execute(part))
    assert sorted(out0.acked) == ["part of task 1", "to 0: s0", "to 0: s1"]
    (joined,) = ctx0.saved
    assert joined["test_accuracy"] == expected["test_accuracy"]
    assert math.isclose(joined["test_loss"], expected["test_loss"], rel_tol=1e-6)
    assert "eval.1.history" not in ctx1.published and ctx0.published["history"] == ctx0.saved
    assert out0.failed == out1.failed == []


def test_a_replay_after_task_0_restarts_gets_task_1s_counts_again():
    run, params = asyncio.run, _params()
    second, _, out1 = _bolt(EvalBolt, "eval", Ctx(eval_tasks=(5, 6), task_index=1))
    for s in (0, 1):
        run(second.execute(_eval_slice(f"s{s}", s, params)))
    lost = _part_of(out1, "lost with task 0's worker")
    # task 0 started anew with no history: the replay brings both slices to both tasks
    first, ctx0, out0 = _bolt(EvalBolt, "eval", Ctx(eval_tasks=(5, 6), task_index=0))
    for s in (0, 1):
        run(first.execute(_eval_slice(f"to 0: replay s{s}", s, params)))
        run(second.execute(_eval_slice(f"to 1: replay s{s}", s, params)))
    assert out1.acked[-2:] == ["to 1: replay s0", "to 1: replay s1"]
    assert [e[2] for e in out1.emitted[-2:]] == [["to 1: replay s0"], ["to 1: replay s1"]]   # sent again
    for k, name in enumerate(("again 1", "again 2")):
        part = _part_of(out1, name) if k else Tup("part", name=name, **{f: lost[f] for f in EVAL_PART})
        run(first.execute(part))
    assert len(ctx0.saved) == 1 and "again 1" in out0.acked and "again 2" in out0.acked   # joined once
    run(first.execute(Tup("part", name="a late copy", **{f: lost[f] for f in EVAL_PART})))
    assert out0.acked[-1] == "a late copy" and len(ctx0.saved) == 1 and first.joins.parts == {}
    assert out0.failed == []


@pytest.mark.parametrize("change, why", [
    ({"count": 15}, "its shard has 16"), ({"task": 2}, "there are eval tasks 0..1"), ({"task": 0}, "task 0"),
    ({"correct": 17}, "17 correct of 16"), ({"loss_sum": -1.0}, "finite number"),
    ({"loss_sum": float("nan")}, "finite number"), ({"count": "16"}, "must be integers"),
    ({"loss_sum": "1.0"}, "finite number")])
def test_a_bad_part_is_refused_and_the_evaluation_still_completes(change, why, caplog):
    run, params = asyncio.run, _params()
    first, ctx0, out0 = _bolt(EvalBolt, "eval", Ctx(eval_tasks=(5, 6), task_index=0))
    good = {"epoch": 1, "step": 23, "task": 1, "correct": 3, "loss_sum": 30.0, "count": 16}
    run(first.execute(Tup("part", name="bad", **{**good, **change})))
    assert out0.failed == ["bad"] and why in caplog.text
    for s in (0, 1):
        run(first.execute(_eval_slice(f"s{s}", s, params)))
    run(first.execute(Tup("part", name="good", **good)))
    assert len(ctx0.saved) == 1 and sorted(out0.acked) == ["good", "s0", "s1"]


def test_a_part_that_reaches_a_task_other_than_0_is_refused():
    second, _, out1 = _bolt(EvalBolt, "eval", Ctx(eval_tasks=(5, 6), task_index=1))
    asyncio.run(second.execute(Tup("part", name="astray", epoch=1, step=23, task=1, correct=0, loss_sum=0.0,
                                   count=16)))
    assert out1.failed == ["astray"] and out1.emitted == []


def test_slices_that_join_to_the_right_size_but_not_each_its_own_are_refused(caplog):
    params = make_model(CFG, dataset_for(CFG).num_classes).params
    bolt, ctx, out = _bolt(EvalBolt, "eval")
    half = (params.size + 1) // 2 + 1                          # one value too many in slice 0, one too few in 1
    long_first = Tup("eval", name="s0", epoch=1, step=23, slice=0, params=params[:half].copy())
    short_second = Tup("eval", name="s1", epoch=1, step=23, slice=1, params=params[half:].copy())
    with caplog.at_level("WARNING"):
        asyncio.run(bolt.execute(long_first))
        asyncio.run(bolt.execute(short_second))
    assert sorted(out.failed) == ["s0", "s1"] and out.acked == [] and ctx.saved is None
    assert "refuses the parameters of epoch 1: slice 0: shape" in caplog.text


@pytest.mark.parametrize("keep", ["3", 2.5, -1, True])
def test_a_checkpoint_keep_that_is_not_a_count_is_refused_when_the_task_starts(tmp_path, keep):
    """A spec's keep "3" (one not built by NS-Map) wrote the file, then clean_up raised a
    TypeError: the round's tuples failed, their replay wrote it again, for ever."""
    config = next(c for c in build_topology(CFG, checkpoint_dir=str(tmp_path)).components
                  if c["id"] == "checkpoint")["config"]
    with pytest.raises(ValueError, match=f"checkpoint keep must be a whole number >= 0 .*got {keep!r}"):
        CheckpointBolt(**dict(config, keep=keep)).prepare(Ctx(), Collector())


def test_a_checkpoint_dir_outside_the_workers_checkpoint_root_is_refused_when_the_task_starts(tmp_path):
    from streamnet.training.checkpoint import CheckpointError, confined_to
    config = next(c for c in build_topology(CFG, checkpoint_dir=str(tmp_path / "elsewhere")).components
                  if c["id"] == "checkpoint")["config"]
    (tmp_path / "root").mkdir()
    with confined_to(str(tmp_path / "root")):
        with pytest.raises(CheckpointError, match="elsewhere is not under this worker's checkpoint root"):
            CheckpointBolt(**config).prepare(Ctx(), Collector())
        CheckpointBolt(**dict(config, dir=str(tmp_path / "root" / "run"))).prepare(Ctx(), Collector())


def test_a_checkpoint_the_coordinator_cannot_record_is_counted_and_the_round_goes_on(tmp_path, caplog):
    from streamnet.runtime import CoordinatorError

    class Unrecorded(Ctx):
        def put_checkpoint(self, pointer):
            raise CoordinatorError("no quorum")
    bolt, ctx, out = _bolt(CheckpointBolt, "checkpoint", ctx=Unrecorded(), checkpoint_dir=str(tmp_path))
    asyncio.run(bolt.execute(_checkpoint_part("s1", 1)))
    asyncio.run(bolt.execute(_checkpoint_part("s0", 0)))
    assert sorted(out.acked) == ["s0", "s1"] and out.failed == []        # not failed for a replay to write again
    assert [s for s, _ in list_checkpoints(str(tmp_path), "run")] == [24]
    assert ctx.saved["errors"] == 1 and ctx.saved["last"]["step"] == 24
    assert "written but not recorded in the coordinator" in caplog.text
