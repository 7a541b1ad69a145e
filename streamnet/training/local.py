"""Old home of the in-process trainer and of the data and model helpers, kept so that
`streamnet.training.local` imports keep working (tests/unit/test_data.py uses it).
New code imports from `streamnet.training` (or `.in_process`, `.schedule`)."""
from .in_process import Progress, TrainResult, train_local
from .schedule import UnitSchedule, load_data, make_model

__all__ = ["Progress", "TrainResult", "train_local", "UnitSchedule", "load_data", "make_model"]
