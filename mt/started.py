"""What `mt.init` found or made for this process: the one thing a Run is built from (mt/start.py makes it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from mt.contract.paths import RunPaths
from mt.facts import Facts
from mt.failsafe import WriteFailures


@dataclass(frozen=True)
class Start:
    """What mt.init found or made for this process: the one thing a Run is built from.

    `usable` False: no run directory could be made (said in `failures`); the script trains unwatched."""

    paths: RunPaths
    rank: int
    world_size: int
    attempt: int
    config: Mapping[str, Any] | None
    max_steps: int | None
    owned: bool
    usable: bool
    failures: WriteFailures
    facts: Facts = Facts()
