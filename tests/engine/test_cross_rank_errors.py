"""Every exception class of the code that runs in the ranks survives pickle, as torch.distributed's
*_object collectives (and DCP's gathering of failures) send it: issue #22 item 3."""
from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from pathlib import Path

import pytest

import engine
import mt
from engine.user import UserCodeError
from mt.contract.config import ConfigError
from mt.contract.space import DiskFullError

# classes whose __init__ takes more than the one message: built with their own fields
SAMPLES = {
    DiskFullError: lambda: DiskFullError("disk full: no room for checkpoint step-4; filesystem /x", Path("/x/checkpoints"), 12, 34),
    ConfigError: lambda: ConfigError("preset.toml", "train.lr", "must be > 0"),
    UserCodeError: lambda: UserCodeError("model.factory", "not callable"),
}


def _exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in mt/ and engine/ (the rank-side code)."""
    found = {}
    for pkg in (mt, engine):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


CLASSES = _exception_classes()


def test_the_classes_are_found():
    assert {DiskFullError, ConfigError, UserCodeError} <= set(CLASSES)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_round_trips_through_pickle(cls):
    e = SAMPLES[cls]() if cls in SAMPLES else cls("one line saying what is wrong")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and str(back) == str(e) and back.args == e.args and vars(back) == vars(e)
    if isinstance(e, DiskFullError):
        assert (back.path, back.free, back.needed, back.errno) == (Path("/x/checkpoints"), 12, 34, e.errno)
