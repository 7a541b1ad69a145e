"""The run summary: what a training run reports, as plain data for JSON."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class EpochRecord:
    epoch: int
    train_loss: float
    test_accuracy: float | None
    test_loss: float | None
    samples: int
    seconds: float
    samples_per_s: float


@dataclass
class RunSummary:
    model: str
    dataset: str
    algorithm: str
    epochs: int
    workers: int
    units: int
    batch: int
    sync_period: int
    test_accuracy: float = 0.0
    test_loss: float = 0.0
    samples_per_s: float = 0.0
    wall_s: float = 0.0
    train_s: float = 0.0
    sync_rounds: int = 0
    samples_processed: int = 0
    num_params: int = 0
    history: list[EpochRecord] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")
