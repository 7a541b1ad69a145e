"""The training topology's streams: each one's fields, declared once, and `row`,
which lays out a tuple's values from their names.

Components declare `outputs` from these tuples and emit `row(FIELDS, name=value,
...)`; receivers read `tup["name"]`. So adding a field to a stream cannot shift
the others, and a missing or misspelt field is an error where the tuple is made.
"""
from __future__ import annotations

# data -> compute (direct): one unit's work for one round
WORK = ("unit", "epoch", "round", "step", "lr_scale", "batches", "checkpoint")
# compute -> sync (default): the unit's result for that round
CONTRIBUTION = ("unit", "epoch", "round", "step", "lr_scale", "samples", "steps", "loss_sum", "vector",
                "status", "checkpoint", "unit_state")
RESYNC = ("task",)                                   # compute -> sync: send me the current parameters
REPLICA = ("task", "step", "params")                 # compute -> sync: my replica, for a new sync task
PARAMS = ("step", "params")                          # sync -> every compute task
DIRECT_PARAMS = ("step", "params", "unit_state")     # sync -> one compute task (its resync)
STATE_REQUEST = ("nonce",)                           # sync -> every compute task: send your replica
EVAL = ("epoch", "step", "params")                   # sync -> eval, at an epoch's end
CHECKPOINT = ("epoch", "step", "params", "state")    # sync -> checkpoint, in a checkpoint round

# a contribution's status: computed now, or the step was already combined (a replay)
OK, APPLIED = "ok", "applied"


def row(fields: tuple[str, ...], **values) -> list:
    """The values in the stream's field order; every field given, no other."""
    if values.keys() != set(fields):
        missing = [f for f in fields if f not in values]
        unknown = sorted(set(values) - set(fields))
        raise KeyError(f"tuple of fields {list(fields)}: missing {missing}, unknown {unknown}")
    return [values[f] for f in fields]
