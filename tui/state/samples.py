"""The newest eval's generated samples ([eval] prompts, `sample` events) and its factory numbers, as a viewer keeps them."""
from __future__ import annotations

from dataclasses import dataclass, field

from mt.contract.records import Eval, Sample


@dataclass
class EvalOutputs:
    """What the newest eval wrote besides val_loss: one sample per prompt (by index) and its metrics."""

    step: int | None = None          # the step of the samples below
    samples: dict[int, Sample] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_step: int | None = None
    count: int = 0                   # samples read in all: a view redraws when it changes

    def add(self, ev: Eval | Sample) -> None:
        """A newer step's first sample replaces the set; a redone step's (after a restart) replaces its own."""
        if isinstance(ev, Eval):
            if ev.metrics:
                self.metrics, self.metrics_step = dict(ev.metrics), ev.step
            return
        if ev.step != self.step:
            self.step, self.samples = ev.step, {}
        self.samples[ev.index if ev.index is not None else len(self.samples)] = ev
        self.count += 1

    def newest(self) -> list[Sample]:
        """The newest eval's samples in prompt order."""
        return [self.samples[i] for i in sorted(self.samples)]
