"""Build the torchrun command line and environment for one attempt (pure functions; its failure report: tui/read/torchrun_log.py).

Multi-node: run `mt launch PRESET --node-rank K` once per node with the same preset
(`nnodes`, `rdzv_endpoint`). Each node gets its own run directory (`<name>-<stamp>` on node 0,
`...-node<K>` elsewhere; no shared filesystem is assumed) and its own supervisor. torchrun's
c10d rendezvous assigns global ranks (sorted by host name, then torchrun pid), so the node
that receives global rank 0 holds events.jsonl and the checkpoints; the others hold their ranks'
logs, heartbeats, status.json and system.jsonl (status.json `worker_pids` lists the ranks).
Under Slurm (`mt launch --slurm`) the nodes share one run directory instead (docs/run-directory.md):
`NodeRole` says which node hosts the rendezvous, `worker_env(node=...)` tells the ranks their node.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from mt.contract.config import HF_OFFLINE, STORE_FD_ENV, Config
from mt.contract.paths import ENV_NODE
from tui.read.procs import usable_cores
from tui.stacks.recorder import recorder_env


def torchrun_command(cfg: Config, run_dir: Path, attempt: int, python: str = sys.executable,
                     log_dir: Path | None = None, node: NodeRole | None = None) -> list[str]:
    """`python -P -m engine.loopback ... --no-python <worker_command>`.

    `-P`: the working directory is not put on sys.path, so a user's own `engine.py` (or
    `torch/`) there cannot shadow ours; `--no-python` is what lets us pass it to the workers.

    One node: `engine.loopback` (torchrun whose rendezvous and agent stores listen on 127.0.0.1
    only; `--standalone` would listen on every interface). Several: torchrun's c10d rendezvous
    at `rdzv_endpoint`; every node passes the same `--rdzv-id`, derived from the run name.
    `--max-restarts 0`: restarts are fresh attempts started by the supervisor (docs/control.md).
    `log_dir`: torchrun's scratch (per-rank error files); without it torchrun leaves a
    `torchelastic_*` folder in the temp dir for good. `node`: a node of a Slurm job (below).
    """
    launch = cfg.launch
    if launch.nnodes == 1:
        cmd = [python, "-P", "-m", "engine.loopback", "--nproc-per-node", str(launch.nproc_per_node),
               "--nnodes", "1", "--rdzv-backend", "mt-loopback", "--rdzv-endpoint", "127.0.0.1:0",
               "--rdzv-id", f"mt-{cfg.run.name}-a{attempt}", "--local-addr", "127.0.0.1"]
    else:
        cmd = [python, "-P", "-m", "torch.distributed.run", "--nproc-per-node", str(launch.nproc_per_node)]
        cmd += [
            "--nnodes", str(launch.nnodes),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", launch.rdzv_endpoint,
            "--rdzv-id", f"mt-{cfg.run.name}-a{attempt}",
        ]
        if node is not None:
            # the first node hosts the rendezvous store, said outright: torchrun's own guess (does
            # the endpoint name this machine?) is true on every node when they share an address.
            # --local-addr: what the others dial for the agent store, and the key ranks are sorted by
            cmd += ["--rdzv-conf", f"is_host={'true' if node.is_host else 'false'}", "--local-addr", node.addr]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir)]
    return cmd + ["--max-restarts", "0", "--no-python", *worker_command(cfg, run_dir, attempt, python)]


@dataclass(frozen=True)
class NodeRole:
    """This node in a Slurm job of several nodes: whether it hosts the rendezvous, its address."""

    is_host: bool
    addr: str


def worker_command(cfg: Config, run_dir: Path, attempt: int, python: str = sys.executable) -> list[str]:
    """One rank: mt's engine, or the user's script under `mt.script` (`[launch] script`)."""
    where = ["--run-dir", str(run_dir), "--attempt", str(attempt)]
    if cfg.launch.script:
        return [python, "-P", "-m", "mt.script", *where, "--", cfg.launch.script, *cfg.launch.script_args]
    return [python, "-P", "-m", "engine", *where]


def is_direct(cfg: Config) -> bool:
    """One process on one node runs without torchrun: it would only add its own start-up (seconds)."""
    return cfg.world_size == 1


def attempt_command(cfg: Config, run_dir: Path, attempt: int, python: str = sys.executable,
                    log_dir: Path | None = None, node: NodeRole | None = None) -> list[str]:
    """What the supervisor starts for an attempt: torchrun, or the one worker under
    `engine.direct`, which first serves the store torchrun's agent would."""
    if is_direct(cfg):
        cmd = worker_command(cfg, run_dir, attempt, python)
        return [*cmd[:3], "engine.direct", *cmd[3:]]  # python -P -m engine.direct MODULE ARGS
    return torchrun_command(cfg, run_dir, attempt, python, log_dir, node)


def worker_env(cfg: Config, base: dict[str, str] | None = None, store: socket.socket | None = None,
               attempt: int = 1, node: str | None = None, flight_dir: Path | None = None) -> dict[str, str]:
    """The environment for torchrun and its workers.

    torchrun sets OMP_NUM_THREADS=1 only when nproc > 1 and leaves it unset for one process,
    so we choose: the cores split evenly between the local workers (a user's value wins).
    `node`: MT_NODE, the node folder its ranks write their heartbeats and logs in (none: the top).
    `store`: a direct attempt's listening socket on loopback, which its worker serves the
    process group's store on (engine/direct.py), as torchrun's agent would. `flight_dir`: where
    PyTorch's flight recorder dumps on an NCCL timeout (tui/stacks/recorder.py; not for device cpu).
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // cfg.launch.nproc_per_node)))
    env["PYTHONUNBUFFERED"] = "1"  # worker logs arrive as they are written
    env.pop(ENV_NODE, None)  # a value from the user's shell would send the heartbeats to another node's folder
    if node is not None:
        env[ENV_NODE] = node
    env.update(HF_OFFLINE)  # a worker never reaches for the network (Hugging Face hub)
    if cfg.launch.nnodes == 1:
        # one node: gloo's and NCCL's bootstrap sockets listen on loopback, not the host's address
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    if is_direct(cfg):
        for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", STORE_FD_ENV):
            env.pop(name, None)  # a value from the user's shell would point at someone else's store
        env.update(direct_rank_env(cfg, attempt, store))
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # as torchrun: the user's value wins
    if flight_dir is not None:
        env.update(recorder_env(cfg, flight_dir, env))
    return env


def direct_rank_env(cfg: Config, attempt: int, store: socket.socket | None) -> dict[str, str]:
    """What torchrun gives its one worker (a script's `init_process_group()` needs MASTER_*)."""
    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
               GROUP_WORLD_SIZE="1", ROLE_RANK="0", ROLE_WORLD_SIZE="1", ROLE_NAME="default",
               TORCHELASTIC_RUN_ID=f"mt-{cfg.run.name}-a{attempt}", TORCHELASTIC_RESTART_COUNT="0",
               TORCHELASTIC_MAX_RESTARTS="0")
    if store is not None:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.getsockname()[1]),
                   TORCHELASTIC_USE_AGENT_STORE="True", **{STORE_FD_ENV: str(store.fileno())})
    return env


