"""Shared helpers for the viewer tests: recorded run directories and a fixed clock."""
from __future__ import annotations

import asyncio
import inspect
import shutil
from pathlib import Path

import pytest

from mt.contract.jsonl import read_events

FIXTURES = Path(__file__).parent / "fixtures"


def copy_fixture(name: str, dest: Path) -> Path:
    """A private copy of a recorded run (tests may append to it)."""
    target = dest / name
    shutil.copytree(FIXTURES / name, target)
    return target


def fixed_now(run_dir: Path, after_s: float = 30.0) -> float:
    """A clock value `after_s` after the run's last event, so ages in snapshots never change."""
    return max(float(e["t"]) for e in read_events(run_dir / "events.jsonl")) + after_s


@pytest.fixture
def fixture_run(tmp_path):
    return lambda name: copy_fixture(name, tmp_path)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` tests in a fresh event loop (no pytest-asyncio in this environment)."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {n: pyfuncitem.funcargs[n] for n in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None
