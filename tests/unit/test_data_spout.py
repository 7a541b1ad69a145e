"""The data spout as the engine builds it (DataSpout(**config), open(ctx, collector)):
its position is saved at every epoch end and at most every SAVE_S within an epoch
(after every round under load balancing), and a spout started from an older
position sends those rounds again with their steps (the units answer them
"applied"; the sync bolt counts each step once)."""
from dataclasses import replace

import numpy as np

from streamnet.runtime.component import Context, SpoutCollector
from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
from streamnet.training import data_spout
from streamnet.training.config import run_config_to_dict
from streamnet.training.data_spout import DataSpout
from streamnet.training.streams import WORK

CFG = RunConfig(model=ModelConfig(name="lenet5"), data=DataConfig(dataset="synthetic", synthetic_train=64,
                                                                   synthetic_test=16),
                algorithm=AlgorithmConfig(name="mixbp", batch=4, sync_period=2), units=2, epochs=2, seed=3)


class Recorder:
    """Stands where the spout's executor stands behind the real SpoutCollector."""

    def __init__(self):
        self.emitted = []

    def emit(self, values, stream, msg_id, direct_task):
        self.emitted.append((msg_id, dict(zip(WORK, values))))
        return [direct_task]


def _spout(saves: list, state=None, cfg=CFG):
    spout = DataSpout(run=run_config_to_dict(cfg), train_size=64)
    ctx = Context(topology="t", component="data", task=0, task_index=0, parallelism=1, worker="w0", config={},
                  component_config=spout.config, component_tasks={"compute": range(1, 3)}.__getitem__,
                  compute=None, publish=lambda k, v: None, save_state=saves.append)
    out = Recorder()
    spout.open(ctx, SpoutCollector(out))
    if state is not None:
        spout.restore(state)
    return spout, out


def _round(spout, out) -> list:
    """Emit a round and ack all of its work; the work values."""
    out.emitted.clear()
    spout.next_tuple()
    sent = list(out.emitted)
    for key, _ in sent:
        spout.ack(key)
    return [w for _, w in sent]


def test_the_position_is_saved_at_epoch_ends_and_every_save_s_within_an_epoch(monkeypatch):
    saves = []
    spout, out = _spout(saves)
    rounds = spout.rounds
    assert rounds >= 3
    monkeypatch.setattr(data_spout, "SAVE_S", 3600.0)
    _round(spout, out)
    assert len(saves) == 1                       # the first round: no save yet
    for _ in range(rounds - 2):
        _round(spout, out)
    assert len(saves) == 1                       # within SAVE_S: none more
    _round(spout, out)                           # the epoch's last round
    assert saves[-1]["epoch"] == 1 and saves[-1]["round"] == 0 and saves[-1]["step"] == rounds
    monkeypatch.setattr(data_spout, "SAVE_S", 0.0)
    _round(spout, out)
    assert saves[-1]["step"] == rounds + 1       # SAVE_S passed: saved again
    while not spout.is_done():
        _round(spout, out)
    assert saves[-1]["epoch"] == 2 and saves[-1]["step"] == 2 * rounds


def test_a_spout_started_from_an_older_position_sends_those_rounds_again(monkeypatch):
    monkeypatch.setattr(data_spout, "SAVE_S", 3600.0)
    saves = []
    first, out = _spout(saves)
    sent = [_round(first, out) for _ in range(3)]
    again, out2 = _spout([], state=saves[-1])    # the first spout's worker died after 3 rounds
    resent = _round(again, out2)
    assert saves[-1]["step"] == 1
    for a, b in zip(sent[1], resent):            # round 1 again: the same work, step and batches
        assert (a["epoch"], a["round"], a["step"], a["unit"]) == (b["epoch"], b["round"], b["step"], b["unit"])
        assert all(np.array_equal(x, y) for x, y in zip(a["batches"], b["batches"]))


def test_under_load_balancing_the_position_is_saved_after_every_round(monkeypatch):
    monkeypatch.setattr(data_spout, "SAVE_S", 3600.0)
    saves = []
    spout, out = _spout(saves, cfg=replace(CFG, balance="load"))
    for step in range(1, 4):
        _round(spout, out)
        assert len(saves) == step and saves[-1]["step"] == step
