"""Weights & Biases through wandb's own client, offline unless the preset says otherwise.

One W&B run per run directory: its id is made once and kept in mirror.json, and every supervisor
(`mt resume`) and every automatic restart continues it (`resume="allow"`). W&B's steps only go
forward, so steps an attempt from an older checkpoint redoes keep their first values there
(TensorBoard purges and shows the newer ones). wandb's start takes seconds and its calls may
block, so they run in a thread of their own: the supervisor's loop only queues. Each logged step
costs the supervisor ~400 us of wandb's CPU, so `every_steps` may thin the training series (never
by default); evals, metrics, samples and incidents always go. docs/run-directory.md#wb.
"""
from __future__ import annotations

import logging
import os
import queue
import secrets
import string
import threading
from typing import Any

from mt.contract.config import Config, ConfigError
from mt.contract.paths import RunPaths

MODES = ("offline", "online", "disabled")
KEYS = ("project", "entity", "mode", "name", "group", "every_steps")
_INIT_KEYS = ("project", "entity", "group")  # passed to wandb.init as they are
_DONE = None
_CLOSE_S = 60.0  # how long the end of a run waits for W&B to write what is queued


# wandb's documented settings (wandb.Settings) that cut what its client and service do besides the
# history: its own system monitor (mt samples the system and mirrors that as system/*), the host
# and machine metadata, git, code and requirements capture, the client-side summary of every row
SETTINGS: dict[str, Any] = dict(console="off", silent=True, x_disable_stats=True, x_disable_meta=True,
                                x_disable_machine_info=True, disable_git=True, disable_code=True, save_code=False,
                                x_save_requirements=False, x_server_side_derived_summary=True)


def check_wandb(table: dict[str, Any], source: str) -> None:
    """[monitor] wandb: known string keys and a project; ConfigError names the key."""
    for key, value in table.items():
        if key not in KEYS:
            raise ConfigError(source, f"monitor.wandb.{key}", f"unknown key (known: {', '.join(KEYS)})")
        if key == "every_steps":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(source, "monitor.wandb.every_steps", f"expected an integer >= 1, got {value!r}")
        elif not isinstance(value, str) or not value:
            raise ConfigError(source, f"monitor.wandb.{key}", f"expected a non-empty string, got {value!r}")
    if "project" not in table:
        raise ConfigError(source, "monitor.wandb.project", "missing (required with [monitor] wandb)")
    if table.get("mode", "offline") not in MODES:
        raise ConfigError(source, "monitor.wandb.mode", f"expected one of {', '.join(MODES)}, got {table['mode']!r}")


def every_steps(table: dict[str, Any]) -> int:
    """[monitor] wandb.every_steps: log every Nth training step (1, the default: every one)."""
    return int(table.get("every_steps", 1))


def wandb_target(table: dict[str, Any]) -> str:
    return "/".join(v for v in (table.get("entity"), table.get("project")) if v)


def new_run_id() -> str:
    """8 lowercase letters and digits, W&B's own shape of a run id."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbSink:
    """Training series at their steps (every `every_steps`th step; evals, a script's own metrics and
    incidents always), system samples and incidents at the newest step, into one W&B run."""

    def __init__(self, paths: RunPaths, cfg: Config, saved: dict[str, Any], log: logging.Logger) -> None:
        if not (isinstance(saved.get("id", ""), str) and all(type(saved.get(k, -1)) is int for k in ("step", "skip_through"))):
            saved = {}   # damaged in mirror.json: a new W&B run from the run's beginning (docs: it starts over)
        self.run_id = saved.get("id") or new_run_id()
        self.step: int = saved.get("step", -1)                  # the newest step logged
        self.skip_through: int = saved.get("skip_through", -1)  # a rollback's redone steps end here
        self.log = log
        self.every = every_steps(cfg.monitor.wandb)
        self.failed = threading.Event()
        self.started = threading.Event()   # wandb.init returned (or failed): bench/mirror_cost.py waits for it
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        table = cfg.monitor.wandb
        init = dict({k: table.get(k) for k in _INIT_KEYS},
                    name=table.get("name") or paths.root.name, mode=table.get("mode", "offline"), id=self.run_id,
                    resume="allow", config=cfg.to_dict(),
                    dir=None if os.environ.get("WANDB_DIR") else str(paths.root))  # offline files: in the run directory
        self._thread = threading.Thread(target=self._work, args=(init,), name="mt-wandb", daemon=True)
        self._thread.start()

    def _work(self, init: dict[str, Any]) -> None:
        try:
            import wandb

            run = wandb.init(**init, settings=wandb.Settings(**SETTINGS))
        except Exception:
            self.log.exception("cannot start the W&B run; the W&B mirror is off")
            self.failed.set()
            return
        finally:
            self.started.set()
        try:
            while (item := self._queue.get()) is not _DONE:
                run.log(item[1], step=item[0])
        except Exception:
            self.log.exception("the W&B mirror failed; it is off")
            self.failed.set()
        finally:
            run.finish()
            wandb.teardown()   # the service process goes now, not at the supervisor's exit

    def _put(self, step: int, values: dict[str, float]) -> None:
        if not self.failed.is_set():
            self._queue.put((step, values))

    def scalars(self, step: int, wall: float, values: dict[str, float], train_step: bool = False) -> None:
        """`train_step`: a step event's series, which [monitor] wandb.every_steps thins."""
        if step <= self.skip_through or step < self.step:
            return   # W&B drops a step behind its newest one
        if train_step and step % self.every:
            return
        self._put(step, values)
        self.step = step

    def samples(self, n: int, wall: float, values: dict[str, float]) -> None:
        if values:
            self.step = max(self.step, 0)
            self._put(self.step, {f"system/{k}": v for k, v in values.items()})

    def text(self, n: int, wall: float, tag: str, text: str, train_step: bool = False) -> None:
        """An incident (or, `train_step`, a generated sample at step n): its markdown as a string value at the
        newest step (a row of W&B's history)."""
        self.step = max(self.step, n if train_step else 0)
        self._put(self.step, {tag: text})

    def rollback(self, step: int, wall: float) -> None:
        self.skip_through = max(self.skip_through, self.step)

    def state(self) -> dict[str, Any]:
        return {"id": self.run_id, "step": self.step, "skip_through": self.skip_through}

    def flush(self) -> None:
        """wandb writes as it goes."""

    def close(self) -> None:
        self._queue.put(_DONE)
        self._thread.join(_CLOSE_S)
        if self._thread.is_alive():
            self.log.warning("W&B did not finish within %.0f s; leaving it", _CLOSE_S)
