"""The UI's views: a snapshot of plain data in, what the pages show out (no cluster)."""
from streamnet.training import DataConfig
from streamnet.training.config import lenet5_mixbp
from streamnet.training.nsmap import build_topology
from streamnet.ui import views


def _spec() -> dict:
    cfg = lenet5_mixbp(data=DataConfig(dataset="synthetic", synthetic_train=64, synthetic_test=16), epochs=1)
    return build_topology(cfg, name="run", train_size=64).to_dict()


def _fig(name, value, **labels):
    return {"name": name, "value": value, "type": "counter" if name.endswith("_total") else "gauge",
            "help": "", "labels": labels}


def _snapshot(sync_figures) -> views.Snapshot:
    compute = {"component": "compute", "executed": 4, "emitted": 2, "acked": 4, "failed": 0, "execute_s_total": 2.0,
               "execute_ms_p99": 900.0,
               "figures": [_fig("training_compute_seconds_total", 3.0, unit="0"),
                           _fig("training_round_trip_seconds_total", 1.5, unit="0")]}
    sync = {"component": "sync", "executed": 2, "emitted": 2, "acked": 2, "failed": 0, "execute_s_total": 0.2,
            "execute_ms_p99": 150.0, "figures": sync_figures}
    return views.Snapshot(
        taken=110.0, workers={"w0": {"host": "h0", "port": 1, "started": 100.0}, "w1": {"host": "h1", "port": 2}},
        statuses={"w0": {"threads": 2, "busy_fraction": 0.5, "leader": True,
                         "topologies": {"run": {"tasks": {"1": compute, "3": sync}}}}},
        unreachable={"w1": "ConnectionRefusedError"},
        topologies={"run": {"spec": _spec(), "status": "active", "assignment": {"tasks": {"1": "w0", "3": "w0"}},
                            "results": {"eval.0.history": [{"epoch": 2, "test_accuracy": 0.8},
                                                           {"epoch": 1, "test_accuracy": 0.6}]}}})


def test_the_nsmap_graph_has_every_component_in_layers_and_labelled_edges():
    g = views.graph(_spec())
    layers = {n["id"]: n["layer"] for n in g["nodes"]}
    assert layers == {"data": 0, "compute": 1, "sync": 2, "eval": 3, "checkpoint": 3}
    assert {n["id"]: n["parallelism"] for n in g["nodes"]}["compute"] == 2
    edges = {(e["from"], e["to"], e["label"]) for e in g["edges"]}
    assert {("data", "compute", "direct"), ("sync", "compute", "all [params]"), ("compute", "sync", "direct"),
            ("sync", "eval", "all [eval]")} <= edges


def test_cluster_topology_and_training_views():
    snap = _snapshot([_fig("training_loss", 0.5), _fig("training_sync_rounds_total", 7),
                      _fig("training_barrier_wait_seconds_total", 0.5, unit="0")])
    c = views.cluster_view(snap)
    assert c["leader"] == "w0" and [w["id"] for w in c["workers"]] == ["w0", "w1"]
    assert c["workers"][0]["uptime_s"] == 10.0 and c["workers"][0]["tasks"] == 2
    assert c["workers"][1]["error"] == "ConnectionRefusedError" and c["workers"][1]["busy_ratio"] is None
    before = _snapshot([])
    before.taken = 108.0
    before.statuses["w0"]["topologies"]["run"]["tasks"]["1"]["execute_s_total"] = 1.0
    snap.before = before
    t = views.topology_view(snap, "run")
    assert t["components"]["compute"]["capacity"] == 0.5          # 1 s of execute in 2 s

    assert t["components"]["compute"]["execute_avg_s"] == 0.5 and t["components"]["compute"]["execute_p99_s"] == 0.9
    assert t["components"]["sync"]["workers"] == {"3": "w0"}
    assert views.is_training(snap, "run")
    views.record_loss(snap, {"run": [[5, 0.9]]})
    r = views.training_view(snap, "run")
    assert r["accuracy"] == [[1, 0.6], [2, 0.8]] and r["loss"] == [[5, 0.9], [7, 0.5]] and r["sync_rounds"] == 7
    assert r["per_unit"] == [{"unit": 0, "worker": "w0", "compute_s": 3.0, "communication_s": 1.0, "wait_s": 0.5}]


def test_a_loss_curve_gains_a_point_only_for_a_new_round():
    snap = _snapshot([_fig("training_loss", 0.5), _fig("training_sync_rounds_total", 7)])
    views.record_loss(snap, {"run": [[7, 0.5]]})
    assert snap.loss_curves["run"] == [[7, 0.5]]


def test_decisions_stragglers_and_bytes_over_every_sync_task():
    snap = _snapshot([_fig("training_sync_received_bytes_total", 100.0),
                      _fig("training_sync_sent_bytes_total", 50.0)])
    second = {"component": "sync", "executed": 1, "emitted": 1, "acked": 1, "failed": 0, "execute_s_total": 0.1,
              "execute_ms_p99": 1.0, "figures": [_fig("training_sync_received_bytes_total", 100.0),
                                                 _fig("training_sync_sent_bytes_total", 50.0)]}
    snap.statuses["w0"]["topologies"]["run"]["tasks"]["4"] = second          # slice 1's sync task
    snap.statuses["w0"]["balance"] = {"run": [{"time": 1.0, "topology": "run", "decision": "older"},
                                              {"time": 2.0, "topology": "run", "decision": "compute shares ..."}]}
    top = [{"unit": 1, "worker": "w1", "rounds": 3, "held_s": 0.2,
            "reasons": {"compute": 3, "communication": 0, "queueing": 0}}]
    snap.topologies["run"]["results"]["sync.0.stragglers"] = {"rounds_judged": 9, "top": top, "last": None}
    assert [d["decision"] for d in views.cluster_view(snap)["decisions"]] == ["compute shares ...", "older"]
    r = views.training_view(snap, "run")
    assert r["bytes_moved"] == 300.0 and r["stragglers"]["top"] == top


def test_a_topology_that_cannot_run_shows_why():
    """A task whose prepare()/open() raised (failed.<task>) and a worker that refused the
    spec (refused.<worker>): on the topologies page, as the client would report them."""
    snap = _snapshot([])
    results = snap.topologies["run"]["results"]
    assert views.topology_view(snap, "run")["failures"] == []
    results["failed.3"] = "bolt 'sync' (task 3) on worker w0 failed to start: ValueError: no slice"
    results["refused.w1"] = "component class 'evil:Bolt' is outside the allowed modules"
    assert views.topology_view(snap, "run")["failures"] == [
        {"kind": "failed", "where": "task 3",
         "error": "bolt 'sync' (task 3) on worker w0 failed to start: ValueError: no slice"},
        {"kind": "refused", "where": "worker w1", "error": "component class 'evil:Bolt' is outside the allowed modules"}]


def test_a_topology_whose_stored_spec_or_results_cannot_be_read_is_left_out_not_the_page(caplog):
    snap = _snapshot([_fig("training_loss", 0.5)])
    good = snap.topologies["run"]
    broken_spec = {**good, "spec": {"components": [{"id": "x"}]}}               # no kind: KeyError
    broken_history = {**good, "results": {"eval.0.history": [{"epoch": 1}]}}    # no test_accuracy
    snap.topologies.update({"a-spec": broken_spec, "b-history": broken_history})
    shown = views.each(views.topology_view, snap, sorted(snap.topologies))
    assert [t["name"] for t in shown] == ["b-history", "run"]
    runs = views.each(views.training_view, snap, ["b-history", "run"])
    assert len(runs) == 1 and runs[0]["accuracy"] == [[1, 0.6], [2, 0.8]]
    assert "topology a-spec left out of topology_view" in caplog.text
    assert "topology b-history left out of training_view" in caplog.text


def test_a_diverged_runs_figures_go_out_as_json_a_browser_reads():
    import json
    import math

    from streamnet.runtime.json_reply import json_reply
    snap = _snapshot([_fig("training_loss", float("nan")), _fig("training_sync_rounds_total", 7)])
    views.record_loss(snap, {"run": [[5, 0.9]]})
    r = views.training_view(snap, "run")
    assert r["loss"] == [[5, 0.9]]                                 # the NaN round is not drawn
    reply = json_reply({"run": r, "loss": float("nan"), "rates": [float("inf"), 1.5]})
    body = json.loads(reply.text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))   # NaN: not JSON
    assert body["loss"] is None and body["rates"] == [None, 1.5]
    assert not math.isnan(body["run"]["loss"][0][1])


def test_a_units_barrier_wait_is_the_most_of_any_sync_slice():
    """Each sync task reports its own; the view kept the last one read, a slice that changed
    with the order of the workers. The run's summary takes the most of any slice."""
    snap = _snapshot([_fig("training_barrier_wait_seconds_total", 0.5, unit="0")])
    second = {"component": "sync", "executed": 2, "emitted": 2, "acked": 2, "failed": 0, "execute_s_total": 0.2,
              "execute_ms_p99": 150.0, "figures": [_fig("training_barrier_wait_seconds_total", 0.25, unit="0")]}
    snap.statuses["w1"] = {"threads": 2, "busy_fraction": 0.5, "topologies": {"run": {"tasks": {"4": second}}}}
    r = views.training_view(snap, "run")
    assert r["per_unit"][0]["wait_s"] == 0.5 and r["per_unit"][0]["communication_s"] == 1.0
