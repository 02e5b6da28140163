"""A real Slurm cluster for the tests: munged, slurmctld and two slurmd (nodes n1, n2) on this machine.

`slurm` (session-scoped) runs `scripts/slurm.sh up` in a fresh folder, yields a `Cluster` whose
`env` a subprocess needs to use it (SLURM_CONF), and runs `scripts/slurm.sh down` at the end,
after failures too. The script installs slurm-wlm and munge where they are missing (CI: a fresh
Debian 12 machine, root); see docs/slurm-testing.md. Every test that uses it is marked slow."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm.sh"
NODES = ("n1", "n2")
T = TypeVar("T")


def _free_port_base() -> int:
    """A port P with P, P+1, P+2 free (slurmctld, slurmd n1, slurmd n2): two sessions side by side
    (pytest -n, or another checkout) each get their own cluster."""
    for base in range(16817, 30000, 7):
        try:
            socks = []
            for port in range(base, base + 3):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("0.0.0.0", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no three free consecutive ports for a test cluster")


class Cluster:
    """The running cluster: its folder, the environment for clients, helpers to drive it."""

    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.path = path
        self.env = env  # os.environ plus SLURM_CONF: what a subprocess needs to use this cluster
        self.conf = Path(env["SLURM_CONF"])
        self.nodes = NODES

    def run(self, *args: str, timeout: float = 60, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """A Slurm command (sbatch, srun, squeue, scontrol, scancel, ...) against this cluster."""
        done = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}")
        return done

    def sbatch(self, *args: str, cwd: Path | None = None) -> str:
        """Submit a batch job; its id."""
        return self.run("sbatch", "--parsable", *args, cwd=cwd).stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """`squeue -h -o %T,%r` for the job: e.g. "RUNNING,None", "PENDING,JobHeldAdmin"; "" once it is gone."""
        return self.run("squeue", "-h", "-j", job, "-o", "%T,%r", check=False).stdout.strip()

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 30, every: float = 0.2) -> T:
        """Poll `probe` until it returns something true; fail naming `what` and the logs' tails."""
        deadline = time.monotonic() + timeout
        while True:
            got = probe()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.logs()}")
            time.sleep(every)

    def logs(self, lines: int = 15) -> str:
        out = []
        for f in sorted((self.path / "log").glob("*.log")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)


def _script(cmd: str, path: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), cmd, str(path)], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def slurm() -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("the test cluster needs root (it installs packages and runs slurmd); CI runs as root")
    # not under pytest's basetemp: sessions running beside this one prune old basetemp folders.
    # Short, because the munge socket's path must fit a unix socket address (108 bytes).
    path = Path(tempfile.mkdtemp(prefix="mt-slurm-"))
    # no SLURM_* of a job this session may itself run in (sbatch would take them for its own)
    client = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    base = _free_port_base()
    # its own job ids too: a job's rendezvous port is 20000 + its id (tui/cluster/slurm.py), and two
    # clusters that both number from 1 put their first 2-node jobs on one port (EADDRINUSE)
    env = dict(client, SLURM_TEST_PORT=str(base), SLURM_TEST_FIRST_JOB_ID=str(1001 + (base - 16817) // 7 * 500 % 11000))
    try:
        # the first run on a fresh machine installs the packages (about 40 s here)
        up = _script("up", path, env, timeout=600)
        if up.returncode != 0:
            raise RuntimeError(f"scripts/slurm.sh up failed ({up.returncode}):\n{up.stderr}")
        cluster = Cluster(path, dict(client, SLURM_CONF=str(path / "slurm.conf")))
        yield cluster
    finally:
        down = _script("down", path, env, timeout=120)
        if down.returncode == 0:
            shutil.rmtree(path, ignore_errors=True)
        else:  # keep the logs for a look
            print(f"scripts/slurm.sh down failed ({down.returncode}); cluster folder kept: {path}\n{down.stderr}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Slurm tests share one test cluster: under `-n 2 --dist loadgroup` they run on one worker."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("slurm"))
