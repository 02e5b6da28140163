"""TensorBoard event files through the tensorboard package's own writer (no TensorFlow, no torch).

Two TensorBoard runs side by side: DIR/ holds the training series at training steps; DIR/system
holds system samples and incidents, numbered by sample (they have times, not steps), so a
rollback's purge of training steps never touches them.
"""
from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path
from typing import BinaryIO

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.record_writer import RecordWriter

SYSTEM_RUN = "system"
_FILES = itertools.count()  # a process's event files never share a name, even within one second


class EventFile:
    """One TensorBoard event file written in the caller's thread with the package's RecordWriter (its
    EventFileWriter adds a queue and a thread per file: half the mirror's CPU at 100 steps/s)."""

    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILES)}"
        self._file: BinaryIO = open(logdir / name, "ab")
        self._records = RecordWriter(self._file)
        # version 2: readers honour SessionLog.START as "drop the steps from here on" (the rollback)
        self.add_event(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_event(self, event: Event) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """Writes one mirror's points; each instance starts new event files (a new supervisor, a new file)."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self.train = EventFile(self.logdir)
        self.system = EventFile(self.logdir / SYSTEM_RUN)

    def scalars(self, step: int, wall: float, values: dict[str, float], train_step: bool = False) -> None:
        """Training series at a training step (every one: `train_step` is for W&B's every_steps)."""
        self._add(self.train, step, wall, values)

    def samples(self, n: int, wall: float, values: dict[str, float]) -> None:
        """A system sample, as sample number n."""
        self._add(self.system, n, wall, values)

    def text(self, n: int, wall: float, tag: str, text: str, train_step: bool = False) -> None:
        """An incident at system sample n, or (`train_step`) a generated sample at training step n."""
        writer = self.train if train_step else self.system
        writer.add_event(Event(wall_time=wall, step=n, summary=text_pb(tag, text)))

    def rollback(self, step: int, wall: float) -> None:
        """Readers drop every training point at `step` or later written before this (an attempt
        restarting from an older checkpoint redoes those steps)."""
        self.train.add_event(Event(wall_time=wall, step=step, session_log=SessionLog(status=SessionLog.START)))

    def state(self) -> dict[str, int]:
        return {}   # all it needs is in the mirror's state

    def flush(self) -> None:
        self.train.flush()
        self.system.flush()

    def close(self) -> None:
        self.train.close()
        self.system.close()

    @staticmethod
    def _add(writer: EventFile, step: int, wall: float, values: dict[str, float]) -> None:
        if values:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
            writer.add_event(Event(wall_time=wall, step=step, summary=summary))


def has_event_files(logdir: Path) -> bool:
    """Whether a folder (or its system run) already holds TensorBoard event files."""
    return any(Path(logdir).glob("events.out.tfevents.*")) or any((Path(logdir) / SYSTEM_RUN).glob("events.out.tfevents.*"))
