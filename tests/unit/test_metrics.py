"""/metrics by the book: prometheus_client's own parser reads what StatusCollector writes."""
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamnet.runtime import component
from streamnet.runtime.component import Context
from streamnet.runtime.prometheus import prometheus


def _ctx() -> Context:
    return Context(topology="t", component="sync", task=3, task_index=0, parallelism=1, worker="w0", config={},
                   component_config={}, component_tasks=lambda c: range(0), compute=None, publish=None,
                   save_state=None)


def _status(figures) -> dict:
    task = {"component": "sync", "kind": "bolt", "executed": 10, "emitted": 4, "acked": 9, "failed": 1,
            "timed_out": 0, "errors": 0, "execute_ms_avg": 2.0, "execute_ms_p99": 7.0, "execute_s_total": 0.02,
            "queue": 16, "queue_max": 64, "overflow": 5, "overflow_most": 9, "figures": figures}
    return {"worker": "w0", "threads": 2, "busy_fraction": 0.25, "leader": True,
            "topologies": {"t": {"tasks": {3: task}}}, "links": {"w1": {"bytes_out": 100}},
            "transport": {"rejected": 0, "frames_in": 5, "bytes_in": 500, "open_streams": 1, "dropped": 0}}


def test_every_family_parses_with_help_type_and_units():
    ctx = _ctx()
    ctx.figure("training_loss", 0.5, help="loss")
    ctx.figure("training_barrier_wait_seconds_total", 1.5, counter=True, unit="1", help="barrier")
    text = prometheus(_status(ctx.figures_status()))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for f in families.values():
        shown = f.name + ("_total" if f.type == "counter" else "")     # the parser strips a counter's _total
        assert f"# HELP {shown} " in text and f"# TYPE {shown} {f.type}" in text, f.name
    assert not [n for n in families if n.endswith("_ms") or "_ms_" in n]       # seconds, not milliseconds
    assert families["streamnet_task_executed"].type == "counter"
    assert families["streamnet_compute_busy_ratio"].samples[0].value == 0.25
    assert families["streamnet_task_queue_fill_ratio"].samples[0].value == 0.25
    assert families["streamnet_task_overflow"].samples[0].value == 5    # unbounded by the queue: no fill ratio
    assert "streamnet_task_overflow_fill_ratio" not in families
    summary = {s.name: s for s in families["streamnet_task_execute_seconds"].samples}
    assert summary["streamnet_task_execute_seconds"].value == 0.007          # p99, in seconds
    assert summary["streamnet_task_execute_seconds_count"].value == 10
    assert families["streamnet_training_loss"].samples[0].labels == {"worker": "w0", "topology": "t",
                                                                      "component": "sync", "task": "3"}
    barrier = families["streamnet_training_barrier_wait_seconds"]
    assert barrier.type == "counter" and barrier.samples[0].labels["unit"] == "1"
    assert barrier.samples[0].name == "streamnet_training_barrier_wait_seconds_total"
    assert any(n.startswith("process_") for n in families)


def test_a_figure_keeps_its_last_value_per_labels_and_names_are_checked():
    ctx = _ctx()
    for v in (1, 2, 3):
        ctx.figure("training_epoch", v, help="epoch")
    ctx.figure("training_compute_seconds_total", 1, counter=True, unit="0", help="s")
    ctx.figure("training_compute_seconds_total", 2, counter=True, unit="1", help="s")
    values = {(f["name"], tuple(f["labels"].items())): f["value"] for f in ctx.figures_status()}
    assert values == {("training_epoch", ()): 3.0, ("training_compute_seconds_total", (("unit", "0"),)): 1.0,
                      ("training_compute_seconds_total", (("unit", "1"),)): 2.0}
    for bad, counter in (("Loss", False), ("loss_total", False), ("rounds", True)):
        with pytest.raises(ValueError):
            ctx.figure(bad, 1, counter=counter, help="x")
    with pytest.raises(ValueError, match="set by the engine"):
        ctx.figure("training_loss", 1, help="x", task="7")
    with pytest.raises(ValueError):      # known as a gauge: reported as a counter it is checked again
        ctx.figure("training_epoch", 4, counter=True, help="epoch")
    assert ctx.figures[("training_epoch", ())].value == 3.0


def test_figures_that_would_take_an_engine_family_or_one_of_another_type_are_left_out(caplog):
    ctx = _ctx()
    ctx.figure("task_executed_total", 99, counter=True, help="named like the engine's")
    ctx.figure("x", 1.0, help="a gauge")
    ctx.figure("x_total", 2.0, counter=True, help="a counter of the same family")
    ctx.figure("training_loss", 0.5, help="loss")
    text = prometheus(_status(ctx.figures_status()))
    families = {f.name: f for f in text_string_to_metric_families(text)}   # a duplicate family fails to parse
    assert text.count("# TYPE streamnet_task_executed_total counter") == 1
    assert [s.value for s in families["streamnet_task_executed"].samples] == [10]     # the engine's, not 99
    assert families["streamnet_x"].type == "gauge" and "streamnet_x_total" not in text
    assert families["streamnet_training_loss"].samples[0].value == 0.5
    assert "leaves out the figure 'task_executed_total'" in caplog.text
    assert "leaves out the figure 'x_total'" in caplog.text


def test_a_figure_named_like_a_series_of_an_engine_summary_is_left_out(caplog):
    """Only family names were compared: a gauge 'task_execute_seconds_count' was a second
    series of one name and labels beside the engine summary's, and Prometheus drops one."""
    ctx = _ctx()
    ctx.figure("task_execute_seconds_count", 99.0, help="named like the summary's count")
    text = prometheus(_status(ctx.figures_status()))
    assert len([line for line in text.splitlines() if line.startswith("streamnet_task_execute_seconds_count{")]) == 1
    summary = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert summary["streamnet_task_execute_seconds_count"].value == 10         # the engine's, not 99
    assert "leaves out the figure 'task_execute_seconds_count'" in caplog.text


def test_a_task_keeps_at_most_max_figures_and_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(component, "MAX_FIGURES", 3)
    ctx = _ctx()
    with caplog.at_level(logging.WARNING):
        for r in range(10):                          # a label whose values grow with the data
            ctx.figure("round_seconds", r, help="s", round=str(r))
    assert [f["labels"] for f in ctx.figures_status()] == [{"round": "0"}, {"round": "1"}, {"round": "2"}]
    ctx.figure("round_seconds", 7.5, help="s", round="1")        # a known one still takes its new value
    assert ctx.figures[("round_seconds", (("round", "1"),))].value == 7.5
    assert sum("more than 3 figures" in r.getMessage() for r in caplog.records) == 1
