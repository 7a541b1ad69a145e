"""The BP family as one mechanism: compute units and the aggregator's arithmetic.

A round is: every unit takes up to H steps on its own batches and hands over one
flat float32 vector; the aggregator averages the vectors (weighted by samples,
summed in unit order so arrival order never matters) and applies one outer step;
every unit continues from the result.

What a unit hands over depends on whether it has an inner optimiser:
- no inner optimiser (cumulative, online): its gradient; the outer step is the
  real SGD-with-momentum update, so K units equal single-process SGD on the union
  of their batches;
- an inner optimiser (MixBP): its parameter change over the round
  (start - end); the outer step with lr 1 and no momentum replaces the
  parameters by the weighted average of the units' parameters, and outer
  momentum turns it into DiLoCo's Nesterov outer step.

Overlap (`AlgorithmConfig.overlap`): a unit's round r + 1 starts from the combined
parameters of step r, x_r, moved by its own round r as the combine would move them had
every unit's round been its own - not from x_{r+1}. With an inner optimiser that is x_r
less its own change d_r; without one (cumulative, online), the outer step's rule applied
to x_r with its own gradient, and a momentum of its own gradients where the outer step's
has the average's. It needs nothing of round r's combine, so it runs while that is
combined and sent: the round trip and the barrier leave the unit's path, and each
update is one round stale, computed near where it lands. (Started from x_r itself, a
gradient one step old under momentum 0.9: LeNet-5 with cumulative BP at 82.5 % after 2
epochs against 88.8 % without overlap, and at chance with `train`'s settings; from its
own step, 88.6 %.) A unit that did not work in a round, or whose change was not finite,
starts its next one from the combined parameters. The single-process trainer and the
topology compute the same rounds.

Nothing here knows where units run: the single-process trainer calls them in a
thread pool, the topology calls them inside bolts.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from .. import kernels as K
from ..errors import StreamnetError
from ..nn import Model, ParallelStep
from .config import AlgorithmConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SGD:
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def step(self, params: np.ndarray, grad: np.ndarray, velocity: np.ndarray, lr_scale: float) -> None:
        K.sgd_step(params, grad, velocity, self.lr * lr_scale, self.momentum, self.weight_decay, self.nesterov)

    def new_velocity(self, size: int) -> np.ndarray:
        return np.zeros(size if self.momentum else 0, np.float32)


@dataclass(frozen=True)
class Plan:
    inner: SGD | None   # None: a unit contributes its gradient, one step per round
    outer: SGD
    scale_outer: bool   # does the lr schedule apply to the outer step (or the inner)?
    overlap: bool = False   # AlgorithmConfig.overlap: a unit's next round runs while its last is combined


def plan_for(alg: AlgorithmConfig) -> Plan:
    if alg.name == "mixbp":
        return Plan(inner=SGD(alg.lr, alg.momentum, alg.weight_decay),
                    outer=SGD(alg.outer_lr, alg.outer_momentum, 0.0, nesterov=alg.outer_momentum > 0),
                    scale_outer=False, overlap=alg.overlap)
    return Plan(inner=None, outer=SGD(alg.lr, alg.momentum, alg.weight_decay), scale_outer=True, overlap=alg.overlap)


def lr_scale(alg: AlgorithmConfig, progress: float) -> float:
    """Multiplier on the learning rate at `progress` in [0, 1] of the run."""
    if alg.lr_schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return 1.0


@dataclass
class Contribution:
    unit: int
    samples: int
    steps: int
    loss_sum: float          # sum over samples of the per-sample loss, for reporting
    vector: np.ndarray       # gradient (no inner optimiser) or parameter change (or one slice of it)
    finite: bool | None = None   # the unit's verdict on its whole vector, when `vector` is a slice of it

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(self.samples, 1)


def trained_loss(contributions: Iterable[Contribution]) -> tuple[float, int]:
    """The training loss summed over the contributions whose update could be used, and
    their samples: a diverged unit's (not finite, refused by the combine) made its
    epoch's reported loss NaN. (Its samples still count as processed: the data went.)"""
    used = [c for c in contributions if c.finite is not False and math.isfinite(c.loss_sum)]
    return sum(c.loss_sum for c in used), sum(c.samples for c in used)


#: a step is split across threads only when each thread gets at least this much work
#: (samples x parameters). Measured first on a loaded machine (perf/report.py): LeNet-5
#: (62k parameters) batch 32 on 2 threads 0.81x of one thread, batch 64 1.27-1.57x;
#: AlexNet-64 (7.7M) batch 64 1.55-1.87x. Again with the chunked step (nn/parallel.py:
#: shared chunk counter, a late pool task cancelled) on the idle machine, LeNet-5 on 2
#: threads against 1, paired blocks: batch 16 1.43x, 32 1.66x, 64 1.73x. 500k: LeNet-5
#: splits from batch 17 (2 threads) up.
MIN_SPLIT_WORK = 500_000


class ComputeUnit:
    """One model replica with its inner optimiser state."""

    def __init__(self, unit: int, model: Model, plan: Plan, threads: int = 1):
        self.unit, self.model, self.plan = unit, model, plan
        # the inner optimiser's momentum; without one, with overlap, the momentum of the
        # unit's own outer steps (continue_from)
        self.velocity = plan.inner.new_velocity(model.num_params) if plan.inner else \
            plan.outer.new_velocity(model.num_params) if plan.overlap else None
        self._round_scale = 1.0    # the lr schedule's multiplier of the last round
        self.start = model.params.copy()
        self._step = None          # a ParallelStep when one step runs on several threads
        self.set_threads(threads)

    def set_threads(self, threads: int) -> None:
        """Run each step on `threads` threads (the batch split across them, reduced in a
        fixed order: the result does not depend on timing, and equals the one-thread
        gradient to float32 rounding)."""
        threads = max(1, int(threads))
        if (self._step.threads if self._step is not None else 1) == threads:
            return
        self.close()
        if threads > 1:
            self._step = ParallelStep(self.model, threads)

    @property
    def threads(self) -> int:
        return self._step.threads if self._step is not None else 1

    def close(self) -> None:
        if self._step is not None:
            self._step.close()
            self._step = None

    def run_round(self, batches: Iterable[tuple[np.ndarray, np.ndarray]], lr_scale: float = 1.0) -> Contribution:
        """One round from the synchronised parameters `start`, or with overlap from the
        unit's own (set by continue_from), its change measured from those."""
        origin = self.model.params.copy() if self.plan.overlap and self.plan.inner is not None else self.start
        self._round_scale = lr_scale
        samples = steps = 0
        loss_sum = 0.0
        inner = self.plan.inner
        for x, y in batches:
            if inner is None and steps:
                raise ValueError("a unit without an inner optimiser takes one batch per round")
            split = self._step is not None and len(y) * self.model.num_params >= MIN_SPLIT_WORK * self._step.threads
            loss, grad = self._step.loss_and_grad(x, y) if split else self.model.loss_and_grad(x, y)
            if inner is not None:
                inner.step(self.model.params, grad, self.velocity, 1.0 if self.plan.scale_outer else lr_scale)
            samples += len(y)
            steps += 1
            loss_sum += loss * len(y)
        if inner is None:
            vector = self.model.grads.copy() if steps else np.zeros_like(self.start)
        else:
            vector = origin - self.model.params
        return Contribution(self.unit, samples, steps, loss_sum, vector)

    def continue_from(self, change: np.ndarray | None, base: np.ndarray | None = None) -> None:
        """Overlap: the next round starts from `base` (by default `start`: the combined
        parameters of the step this unit's last round was combined into) moved by its own
        last round: less its `change` with an inner optimiser; without one, by the outer
        step's rule with `change` (its gradient) and the unit's own velocity, at the last
        round's learning-rate multiplier. From `base` alone for a unit whose change was not
        finite, or that did not work (None)."""
        base = self.start if base is None else base
        if change is None or not K.all_finite(change):
            self.model.params[...] = base
        elif self.plan.inner is None:
            self.model.params[...] = base
            self.plan.outer.step(self.model.params, change, self.velocity, self._round_scale)
        else:
            np.subtract(base, change, out=self.model.params)

    def receive(self, params: np.ndarray) -> None:
        """Continue from the synchronised parameters."""
        self.model.set_params(params)
        self.start[...] = params

    def receive_slice(self, lo: int, hi: int, part: np.ndarray, local: bool = True) -> None:
        """Continue from the synchronised parameters, one sync task's slice [lo, hi) at a
        time; without `local` (overlap) only `start` takes it, the unit's own parameters
        (a round may be running from them) are left to continue_from."""
        if local:
            self.model.params[lo:hi] = part
        self.start[lo:hi] = part

    def state(self, local: bool = False) -> dict:
        """What this unit carries from one round to the next besides the parameters; with
        `local` (overlap) its own parameters too, where its next round starts."""
        s = {"velocity": self.velocity.copy() if self.velocity is not None else None,
             "random": self.model.random_state()}
        if local:
            s["local"] = self.model.params.copy()
        return s

    def set_state(self, state: dict) -> np.ndarray | None:
        """Take `state` (from state()); a ValueError, for a state of another model, leaves
        this unit as it was. Returns the unit's own parameters if the state has them, for
        the caller to start from once the parameters of their step are in."""
        velocity = state.get("velocity") if self.velocity is not None else None
        if velocity is not None and (not isinstance(velocity, np.ndarray) or velocity.shape != self.velocity.shape):
            raise ValueError(f"unit {self.unit}: velocity of {getattr(velocity, 'size', velocity)!r} values for "
                             f"{self.velocity.size} parameters")
        local = state.get("local")
        if local is not None and (not isinstance(local, np.ndarray) or local.shape != self.model.params.shape
                                  or local.dtype != np.float32):
            raise ValueError(f"unit {self.unit}: own parameters of {getattr(local, 'size', local)!r} values for "
                             f"{self.model.num_params} float32 parameters")
        self.model.set_random_state(state.get("random", []))     # checks its length before it changes anything
        if velocity is not None:
            self.velocity[...] = velocity
        return None if local is None else local.copy()


#: rounds in a row in which a unit's contribution was refused as not finite, after which
#: a run is declared diverged: once may be a bad batch, and the unit starts its next round
#: from the combined parameters; every time it works means the learning rate is too large
#: for it (and the others go on alone, or not at all)
DIVERGED_ROUNDS = 3


class TrainingDiverged(StreamnetError):
    """The run cannot make progress: its updates are not finite."""


class Aggregator:
    """The sync bolt's arithmetic: weighted average of contributions, then one outer step.

    A unit whose contribution is not finite is left out of its round (the others are
    combined). TrainingDiverged when a unit's was left out in DIVERGED_ROUNDS rounds in a
    row that it worked in, when every unit's of a round was (nothing to combine), or when
    the outer step itself made the parameters not finite (a large outer learning rate or
    momentum): the run would otherwise go on to its end on the other units alone or on
    none (a test accuracy at chance), or with every unit refusing the parameters it is
    sent."""

    def __init__(self, params: np.ndarray, plan: Plan):
        self.plan = plan
        self.params = np.array(params, dtype=np.float32, copy=True)
        self.velocity = plan.outer.new_velocity(self.params.size)
        self.refused: list[tuple[int, str]] = []
        self.nonfinite: dict[int, int] = {}     # unit -> rounds in a row its contribution was not finite

    def state(self) -> dict:
        return {"velocity": self.velocity.copy()}

    def set_state(self, state: dict) -> None:
        v = state.get("velocity")
        if v is not None and v.shape == self.velocity.shape:
            self.velocity[...] = v

    def combine(self, contributions: list[Contribution], lr_scale: float = 1.0, step: int | None = None) -> np.ndarray:
        usable, refused = [], False
        for c in sorted(contributions, key=lambda c: c.unit):
            if c.samples == 0:
                continue
            if c.finite is False or not K.all_finite(c.vector):   # a slice drops the unit the whole would
                refused = True
                log.warning("refusing the contribution of unit %d to step %s: non-finite values (its %d "
                            "local step(s) diverged); the others are combined", c.unit, step, c.steps)
                self.refused.append((c.unit, "non-finite"))
                self.nonfinite[c.unit] = self.nonfinite.get(c.unit, 0) + 1
                if self.nonfinite[c.unit] >= DIVERGED_ROUNDS:
                    raise TrainingDiverged(
                        f"training diverged: unit {c.unit}'s update was not finite in {self.nonfinite[c.unit]} "
                        f"rounds in a row (up to step {step}); try a smaller learning rate (--lr)")
                continue
            self.nonfinite.pop(c.unit, None)
            usable.append(c)
        if not usable:
            if refused:
                # every unit that worked diverged: nothing moves, and a short run went on to
                # report success with a training loss of 0 and a test accuracy at chance
                raise TrainingDiverged(f"training diverged at step {step}: every unit's update was not finite, "
                                       "nothing to combine; try a smaller learning rate (--lr)")
            return self.params
        if len(usable) == 1:
            avg = usable[0].vector
        else:
            avg = np.empty_like(self.params)
            K.weighted_average(avg, np.stack([c.vector for c in usable]),
                               np.array([c.samples for c in usable], np.float64))
        self.plan.outer.step(self.params, avg, self.velocity, lr_scale if self.plan.scale_outer else 1.0)
        if not K.all_finite(self.params):
            raise TrainingDiverged(f"training diverged at step {step}: the outer step made the parameters not "
                                   "finite; try a smaller learning rate (--lr, --set outer_lr=...) or --outer-momentum")
        return self.params
