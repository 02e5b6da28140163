"""PyTorch's NCCL flight recorder for mt's runs: on for NCCL (its ring buffer of collectives, dumped
on a watchdog timeout into the run directory's flight/), and its dumps read by mt itself, through the
door, with an unpickler that builds plain values only (tui/stacks/flight.py; the tui never imports
torch); docs/run-directory.md, flight/."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from mt.contract import door
from mt.contract.config import Config
from tui.stacks.flight import NotADump, Unjoined, load_dump, unjoined

BUFFER_ENTRIES = "2000"   # collectives kept per rank: torch's own examples; a few hundred KiB per rank
DUMP_PREFIX = "rank_"     # torch appends the global rank: flight/rank_0, flight/rank_1, ...
# A real 2000-entry dump is 250 KB (4 frames per collective) to 500 KB (64 shared frames; torch
# 2.13, gloo, tests/diagnose/test_flight.py); 8 KiB per entry leaves room for 64 frames that are
# all different, and a dump bigger than that is refused rather than unpickled into the supervisor.
MAX_DUMP_BYTES = int(BUFFER_ENTRIES) * 8192
_DUMP = re.compile(re.escape(DUMP_PREFIX) + r"\d{1,9}")   # a rank; more digits are no dump of torch's
_OFF = ("0", "false", "no", "off")
# Each setting under every name a supported torch (2.2+) reads, newest first: torch 2.2 to 2.8 read
# only the TORCH_NCCL_* names (ProcessGroupNCCL.hpp), 2.9 added TORCH_FR_BUFFER_SIZE and
# TORCH_FR_DUMP_TEMP_FILE (torch/csrc/distributed/c10d/FlightRecorder.hpp, the old names kept as
# aliases), and later torch TORCH_FR_DUMP_ON_TIMEOUT. mt sets every name of a setting, so whichever
# torch the ranks import finds it (a newer torch warns once that the old name is deprecated).
_NAMES = {
    "buffer": ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    "dump": ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT"),
    "file": ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
}


def _users(base: dict[str, str], setting: str) -> str | None:
    """The user's value for a setting, under whichever of its names they used (the newest first)."""
    return next((base[k] for k in _NAMES[setting] if k in base), None)


def _wanted(cfg: Config, flight_dir: Path, base: dict[str, str]) -> dict[str, str]:
    """The recorder's variables mt adds for this run: none for device cpu or when the user turned the
    recorder (or its dump on timeout) off; a setting the user gave under any of its names is theirs."""
    buffer, dump = _users(base, "buffer") or BUFFER_ENTRIES, _users(base, "dump") or "1"
    if cfg.launch.device == "cpu" or buffer.strip() in _OFF or dump.strip().lower() in _OFF:
        return {}
    values = {"buffer": BUFFER_ENTRIES, "dump": "1", "file": str(flight_dir / DUMP_PREFIX)}
    return {name: values[setting] for setting, names in _NAMES.items() if _users(base, setting) is None
            for name in names}


def recorder_env(cfg: Config, flight_dir: Path, base: dict[str, str]) -> dict[str, str]:
    """The flight recorder's variables for a run that may use NCCL (device cuda or auto; never cpu),
    creating flight_dir, under the names of every torch from 2.2 on (_NAMES); a value the user set wins."""
    want = _wanted(cfg, flight_dir, base)
    if not want:
        return {}
    try:
        flight_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return {}  # no folder for the dump: the run goes on without the recorder
    return want


def dumps_here(cfg: Config, flight_dir: Path, base: dict[str, str]) -> bool:
    """Whether mt sends this run's dumps into flight_dir (recorder_env's choice for the same
    environment): only then does the supervisor watch the folder."""
    return "TORCH_FR_DUMP_TEMP_FILE" in _wanted(cfg, flight_dir, base)


def dumps_in(flight_dir: Path) -> dict[str, tuple[int, float]]:
    """The ranks' dump files in flight_dir: name -> (size, mtime)."""
    try:
        return {e.name: (e.stat().st_size, e.stat().st_mtime) for e in os.scandir(flight_dir)
                if _DUMP.fullmatch(e.name) and e.is_file(follow_symlinks=False)}
    except OSError:
        return {}


@dataclass(frozen=True)
class FlightReport:
    """What mt made of a folder of dumps: the collectives not every rank joined, and any dump it refused."""

    folder: Path
    unjoined: tuple[Unjoined, ...]
    error: str = ""

    def line(self) -> str:
        """The first unjoined collective; else why there is no analysis; else that all joined."""
        if self.unjoined:
            return "flight recorder: " + self.unjoined[0].line()
        if self.error:
            return f"flight recorder: no analysis ({self.error})"
        return "flight recorder: every rank joined every recorded collective"


def analyze(flight_dir: Path) -> FlightReport:
    """Read every rank's dump in flight_dir through the door (plain values only, at most
    MAX_DUMP_BYTES each) and name the collectives not every rank joined; a refused dump is the error."""
    dumps, errors = [], []
    for name in sorted(dumps_in(flight_dir), key=lambda n: int(n[len(DUMP_PREFIX):])):
        try:
            data = door.read_bytes(flight_dir / name, MAX_DUMP_BYTES)
            dumps.append(load_dump(data, int(name[len(DUMP_PREFIX):])))
        except FileNotFoundError:
            continue
        except (OSError, NotADump) as e:
            errors.append(f"{name} refused: {str(e).removeprefix(f'{flight_dir / name}: ')}")
    if not dumps and not errors:
        errors.append("no dump in the folder")
    return FlightReport(flight_dir, tuple(unjoined(dumps)), "; ".join(errors))


class FlightWatch:
    """Notices a new set of dumps in flight/ once it stopped changing (torch writes one file per rank,
    each rank on its own timeout); dumps already there when it starts (an earlier attempt's) are old."""

    def __init__(self, flight_dir: Path, settle_s: float = 2.0) -> None:
        self.dir, self.settle_s = flight_dir, settle_s
        self._taken = dumps_in(flight_dir)
        self._last: dict[str, tuple[int, float]] = {}
        self._since = 0.0

    def ready(self, now: float) -> bool:
        """True once per new set of dumps, `settle_s` after its last change (`now`: monotonic seconds)."""
        cur = dumps_in(self.dir)
        if not cur or cur == self._taken:
            return False
        if cur != self._last:
            self._last, self._since = cur, now
            return False
        if now - self._since < self.settle_s:
            return False
        self._taken = cur
        return True
