"""The training topology's streams: each one's fields, declared once, and `row`,
which lays out a tuple's values from their names.

Components declare `outputs` from these tuples and emit `row(FIELDS, name=value,
...)`; receivers read `tup["name"]`. So adding a field to a stream cannot shift
the others, and a missing or misspelt field is an error where the tuple is made.
"""
from __future__ import annotations

# data -> compute (direct): one unit's work for one round; `share`: the work share it was
# cut with (load balancing; 1.0 otherwise), which the unit's speed is reported under
WORK = ("unit", "epoch", "round", "step", "lr_scale", "batches", "checkpoint", "share")
# With S sync tasks, sync task s owns slice s of the flat vector (slices.py): every
# stream that carries a vector or a part of it names its slice.
# compute -> sync s (direct): the unit's result for that round, slice s of its vector;
# `finite` is the unit's verdict on the whole vector (every slice drops a diverged unit)
# `timing`: {"compute_s", "queue_s", "worker"} of the round (straggler attribution), None in a replay's answer
# `share`: the unit's work share the data spout cut the round with (a checkpoint keeps them)
CONTRIBUTION = ("unit", "epoch", "round", "step", "lr_scale", "samples", "steps", "loss_sum", "slice", "vector",
                "finite", "status", "checkpoint", "unit_state", "timing", "share")
# compute -> every sync task: send me your slice; `step`: the earliest work the unit holds
# if it computed nothing at its parameters' step, else None (sync_recovery `_resync`)
RESYNC = ("task", "step")
REPLICA = ("task", "slice", "step", "params")        # compute -> sync s (direct): my slice s, for a new sync task
# `generation`: the sending sync task instance's fencing token (Context.generation); a
# unit takes no parameters from an instance older than one that asked for its replica
PARAMS = ("step", "slice", "params", "generation")                 # sync s -> every compute task
DIRECT_PARAMS = ("step", "slice", "params", "unit_state", "generation")   # sync s -> one compute task (its resync)
STATE_REQUEST = ("nonce", "slice", "generation")     # sync s -> every compute task: send your slice s
EVAL = ("epoch", "step", "slice", "params")          # sync s -> eval, at an epoch's end
# eval task k > 0 -> eval task 0 (direct): its shard's counts of that epoch end's evaluation
EVAL_PART = ("epoch", "step", "task", "correct", "loss_sum", "count")
CHECKPOINT = ("epoch", "step", "slice", "params", "state")   # sync s -> checkpoint, in a checkpoint round

# a contribution's status: computed now, or the step was already combined (a replay)
OK, APPLIED = "ok", "applied"


def row(fields: tuple[str, ...], **values) -> list:
    """The values in the stream's field order; every field given, no other."""
    if values.keys() != set(fields):
        missing = [f for f in fields if f not in values]
        unknown = sorted(set(values) - set(fields))
        raise KeyError(f"tuple of fields {list(fields)}: missing {missing}, unknown {unknown}")
    return [values[f] for f in fields]
