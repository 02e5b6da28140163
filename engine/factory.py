"""Calling a user's factory: import `module:attr`, check its arguments, call it; every problem is a
UserCodeError naming the preset key."""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any, Callable

from mt.contract.config import Config


class UserCodeError(ValueError):
    """A factory that cannot be used; `key` is the preset key that names it."""

    def __init__(self, key: str, message: str) -> None:
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}")

    def __reduce__(self) -> tuple:
        return type(self), (self.key, self.message)  # args holds the joined line only


def add_workdir(cfg: Config) -> None:
    """Make the folder `mt launch` ran in importable first (the workers run with `python -P`)."""
    if cfg.run.workdir and cfg.run.workdir not in sys.path:
        sys.path.insert(0, cfg.run.workdir)


def import_callable(spec: str, key: str, workdir: str = "") -> Callable[..., Any]:
    """`module:attr.path` as a callable, or UserCodeError saying which part is wrong (and, for a
    module not found, where it was looked for: `workdir` is the folder mt launch ran in)."""
    module_name, _, attr_path = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            where = f" (it imports {e.name!r}, which is not installed)"
        else:
            folder = workdir or os.getcwd()
            where = (f": looked in {folder} (where mt launch ran) and the installed packages; run mt launch from the"
                     f" folder that holds {module_name.replace('.', '/')}.py, or set [run] workdir to it")
        raise UserCodeError(key, f"cannot import module {module_name!r}{where}") from None
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises while importing
        raise UserCodeError(key, f"importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise UserCodeError(key, f"module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserCodeError(key, f"{spec} is not callable (it is a {type(obj).__name__})")
    return obj


def check_args(fn: Callable[..., Any], spec: str, key: str, *args: Any, **kwargs: Any) -> None:
    """The factory's signature must accept these arguments (checked before calling it)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable without a signature: find out when it is called
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise UserCodeError(key, f"{spec}{sig} does not accept {_describe(args, kwargs)}: {e}") from None


def call_factory(fn: Callable[..., Any], spec: str, key: str, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs); what it raises becomes a UserCodeError naming the factory and its call."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # whatever the user's factory raises is theirs to fix
        raise UserCodeError(key, f"{spec}{_describe(args, kwargs, '()')} raised {type(e).__name__}: {e}") from e


def _describe(args: tuple[Any, ...], kwargs: dict[str, Any], empty: str = "no arguments") -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"({', '.join(parts)})" if parts else empty
