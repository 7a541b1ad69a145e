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
    #: after the last evaluated epoch; None where no evaluated epoch ended (a run stopped
    #: before its first), not 0.0, which read as a measured accuracy
    test_accuracy: float | None = None
    test_loss: float | None = None
    samples_per_s: float = 0.0
    wall_s: float = 0.0
    train_s: float = 0.0
    sync_rounds: int = 0
    samples_processed: int = 0
    num_params: int = 0
    history: list[EpochRecord] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def accuracy_line(self) -> str:
        """The final test accuracy in words: of which epoch, when a later one ended
        unevaluated (a run stopped with --eval-every), and none when none was measured."""
        if self.test_accuracy is None:
            return "no test accuracy (the run ended before an evaluated epoch did)"
        line = f"test accuracy {self.test_accuracy:.2%}"
        evaluated = [h.epoch for h in self.history if h.test_accuracy is not None]
        if evaluated and self.history and evaluated[-1] < self.history[-1].epoch:
            line += f" (after epoch {evaluated[-1]}; epoch {self.history[-1].epoch} ended unevaluated)"
        return line

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")
