"""PyTorch's NCCL flight recorder for mt's runs: on for NCCL (its ring buffer of collectives, dumped
on a watchdog timeout into the run directory's flight/), and its dump read by torch's own analyzer
in a subprocess (the tui never imports torch); docs/run-directory.md, flight/."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mt.contract.config import Config
from tui.diagnose.flight import Unjoined, parse_fr_trace

BUFFER_ENTRIES = "2000"   # collectives kept per rank: torch's own examples; a few hundred KiB per rank
DUMP_PREFIX = "rank_"     # torch appends the global rank: flight/rank_0, flight/rank_1, ...
_ANALYZER = "torch.distributed.flight_recorder.fr_trace"
_DUMP = re.compile(re.escape(DUMP_PREFIX) + r"\d+")


def recorder_env(cfg: Config, flight_dir: Path, base: dict[str, str]) -> dict[str, str]:
    """The flight recorder's variables for a run that may use NCCL (device cuda or auto; never cpu),
    creating flight_dir; a value the user set wins. torch 2.13's names (TORCH_NCCL_TRACE_BUFFER_SIZE
    and TORCH_NCCL_DEBUG_INFO_TEMP_FILE are their deprecated aliases)."""
    if cfg.launch.device == "cpu":
        return {}
    try:
        flight_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return {}  # no folder for the dump: the run goes on without the recorder
    want = {"TORCH_FR_BUFFER_SIZE": BUFFER_ENTRIES, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": str(flight_dir / DUMP_PREFIX)}
    aliases = {"TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
               "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
    return {k: v for k, v in want.items() if k not in base and aliases.get(k) not in base}


def dumps_in(flight_dir: Path) -> dict[str, tuple[int, float]]:
    """The ranks' dump files in flight_dir: name -> (size, mtime)."""
    try:
        return {e.name: (e.stat().st_size, e.stat().st_mtime) for e in os.scandir(flight_dir)
                if _DUMP.fullmatch(e.name) and e.is_file(follow_symlinks=False)}
    except OSError:
        return {}


@dataclass(frozen=True)
class FlightReport:
    """What torch's analyzer made of a folder of dumps: the collectives not every rank joined, or why nothing."""

    folder: Path
    unjoined: tuple[Unjoined, ...]
    error: str = ""

    def line(self) -> str:
        if self.error:
            return f"flight recorder: no analysis ({self.error})"
        if not self.unjoined:
            return "flight recorder: every rank joined every recorded collective"
        return "flight recorder: " + self.unjoined[0].line()


def analyze(flight_dir: Path, python: str = sys.executable, timeout_s: float = 120.0) -> FlightReport:
    """Run torch's analyzer over flight_dir (every rank's dump, or those there: --allow-incomplete-ranks)."""
    cmd = [python, "-P", "-m", _ANALYZER, str(flight_dir), "--prefix", DUMP_PREFIX, "--allow-incomplete-ranks"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return FlightReport(flight_dir, (), f"{_ANALYZER} did not run: {e}")
    found = tuple(parse_fr_trace(out.stdout + "\n" + out.stderr))  # it reports through logging: stderr
    if out.returncode != 0 and not found:
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1][:300]
        return FlightReport(flight_dir, (), f"torch's analyzer failed: {last}")
    return FlightReport(flight_dir, found)


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
