"""Where networks meet the engine: NS-Map, the BP family, training spouts and bolts."""
from .bp import SGD, Aggregator, ComputeUnit, Contribution, Plan, lr_scale, plan_for
from .config import (SETUPS, AlgorithmConfig, DataConfig, ModelConfig, RunConfig, alexnet_mixbp,
                     lenet5_cumulative, lenet5_mixbp, lenet5_online)
from .evaluate import evaluate
from .in_process import Progress, TrainResult, train_local
from .run_stats import ResultsError, RunStats, SyncStats
from .schedule import UnitSchedule, load_data, make_model
from .summary import EpochRecord, RunSummary

__all__ = ["SGD", "Aggregator", "ComputeUnit", "Contribution", "Plan", "lr_scale", "plan_for",
           "AlgorithmConfig", "DataConfig", "ModelConfig", "RunConfig", "SETUPS", "lenet5_mixbp",
           "lenet5_cumulative", "lenet5_online", "alexnet_mixbp", "evaluate", "Progress", "load_data",
           "make_model", "train_local", "TrainResult", "UnitSchedule", "EpochRecord", "RunSummary",
           "ResultsError", "RunStats", "SyncStats"]
