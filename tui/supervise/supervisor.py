"""The run supervisor: one detached process per run (per node) that owns torchrun.

It starts torchrun for each attempt, records every transition in status.json, samples the
system into system.jsonl once a second, runs the incident rules, and starts a fresh attempt
from the newest checkpoint when a worker dies and `[launch] max_restarts` allows.

Signals: SIGTERM/SIGINT = graceful stop (forwarded to torchrun, which forwards to the workers;
they write a final checkpoint; under Slurm its SIGTERM reached every task already and is not
forwarded, and it is a preemption: tui/cluster/preempt.py). SIGUSR1 = `mt kill` is terminating the run: never restart,
record `killed`, SIGUSR1 (never SIGTERM: no rank saves) to torchrun and the ranks.
Its process (arguments, the lock, daemonizing) is tui/supervise/supervisor_main.py:
`python -m tui.supervise.supervisor_main --run-dir DIR [--daemon | --slurm]`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from mt.contract import door, fmt, rollback, space
from mt.contract.checkpoints import newest
from mt.contract.events import dumps
from mt.contract.paths import RunPaths
from mt.contract.preset import load_config_json
from mt.contract.records import ControlEvent, Record, RecordTail, RunEnd, RunStart
from mt.contract.status import CLEAN_STATES, read_status, save_status
from tui.cluster.peers import JOB_END_WAIT_S, JOB_START_WAIT_S, PEER_WAIT_S, PeerNodes, next_attempt
from tui.cluster.preempt import JobEnd
from tui.cluster.slurm import hostnames, node_addr, slurm_launch, slurm_node
from tui.mirror.mirror import MirrorHook
from tui.mirror.notify import NotifyHook
from tui.read.nodes import JobReader
from tui.read.procs import rank_processes, run_processes
from tui.read.torchrun_log import worker_exit_code
from tui.supervise import lock as runlock
from tui.supervise import procs
from tui.supervise.devices import node_device_problem
from tui.supervise.diagnosis import IncidentHook
from tui.supervise.failure import attempt_failure, end_if_hung, failures_since
from tui.supervise.procs import die_with_parent, file_logger, kill_all, terminate_all
from tui.supervise.sampler import SystemSampler
from tui.supervise.torchrun import NodeRole, attempt_command, is_direct, worker_env


class Supervisor:
    """Runs attempts until the run completes, stops, is killed or runs out of restarts."""

    def __init__(self, run_dir: Path, poll_s: float = 1.0, slurm: bool = False) -> None:
        self.run_dir = Path(run_dir).resolve()
        # a Slurm job of several nodes shares one run directory: this node's files under nodes/<node>/
        self.node = slurm_node(os.environ) if slurm else None
        self.under_slurm = slurm
        self.paths = RunPaths(self.run_dir, self.node)
        self.poll_s = poll_s
        self.log = file_logger(self.paths.supervisor_log)
        self.cfg = load_config_json(self.paths.config)
        self.status = read_status(self.run_dir)   # the job's: where the attempts count from on every node
        if slurm:  # inside an allocation: this node's identity, the shape and the rendezvous are Slurm's
            self.cfg = dataclasses.replace(self.cfg, launch=slurm_launch(self.cfg.launch, os.environ))
            self.status.slurm_job_id = os.environ.get("SLURM_JOB_ID") or self.status.slurm_job_id
            self.log.info("slurm job %s, node %s (node rank %d of %d)", os.environ.get("SLURM_JOB_ID"),
                          os.environ.get("SLURMD_NODENAME"), self.cfg.launch.node_rank, self.cfg.launch.nnodes)
        # the job's supervisor (the only one without a node, or node rank 0) writes the job's files
        self.is_job = self.node is None or self.cfg.launch.node_rank == 0
        self.role = None if self.node is None else NodeRole(is_host=self.is_job, addr=node_addr(self.node))
        self.status.node = self.node
        if self.node is not None and self.is_job:   # the job's nodes: the only folders under nodes/ its readers count
            self.status.job_nodes = hostnames(os.environ.get("SLURM_JOB_NODELIST", ""))
        self.job = JobReader(self.run_dir)   # the one reader of nodes/: the peer watch and the rules' ticks share it
        self.peers = PeerNodes(self.paths, self.job, self.log)
        # the job's supervisor (node 0) records the job's end and requeues it; other nodes never do
        self.slurm = JobEnd(slurm, self.status.slurm_job_id if slurm and self.cfg.launch.node_rank == 0 else None)
        self.stop_requested = False
        self.kill_requested = False
        self.events = RecordTail(self.paths.events)  # the one reader of events.jsonl here
        self.news: list[Record] = []                  # events read since the last tick
        self.ranks: dict[int, int] = {}               # this node's workers: rank -> pid
        self.torchrun: subprocess.Popen[bytes] | None = None
        self.current_attempt: int | None = None  # from the newest run_start event
        self.dir_watch = runlock.DirWatch(self.run_dir)
        self.lost: str | None = None  # the run dir is gone or replaced: write nothing more there
        self.hung: str | None = None  # this attempt was ended on a hang verdict: why (its failure reason)
        self.peer_tick = 0.0          # the next tick while waiting for the other nodes' reports (monotonic)

    # -- status ----------------------------------------------------------------------------
    def finish(self, state: str, code: int, exit_code: int | None, reason: str) -> int:
        """The last transition; the incident rules see the final state once more. Under Slurm a
        preempted run is `pending` again and requeued; a cancelled one says Slurm's word."""
        end = self.slurm.ending(state, reason)
        if end is not None:
            state, reason, self.status.slurm_state = end.state, end.reason, end.slurm_state
        self.status.end(state, reason, time.time(), exit_code)
        self.mirrors.poll(self.news, (self.events.line_offset, self.events.ino))
        self.mirrors.close()  # before the final state: whoever sees the run ended finds its whole log
        self.write_status(state)
        self.tick()
        self.paths.reserve.unlink(missing_ok=True)  # needed only while the run lives; a resume makes it again
        failed = self.slurm.requeue(end)   # Slurm ends this job's processes now: all is written
        if failed:
            self.status.end("stopped", f"{reason}; but {failed}", time.time(), exit_code)
            self.status.slurm_state = None
            self.write_status("stopped")
        return code

    def write_status(self, state: str, note: str = "") -> None:
        """Record a transition to `state`, with the fields set before it (atomic)."""
        self.status.move(state)
        self.status.supervisor_pid = os.getpid()
        self.save_status()
        self.log.info("state %s %s", state, note or dumps({"reason": self.status.reason}))

    def save_status(self) -> None:
        """Write status.json (the job's and this node's, or this node's); a full disk spends the reserve."""
        if self.lost:
            return
        try:
            if save_status(self.paths, self.status, node_only=not self.is_job):
                self.log.warning("disk full: deleted %s to record the run's state", self.paths.reserve)
        except OSError as e:
            if not space.is_disk_full(e):
                raise
            # the previous status.json stays whole (the rename never happened); next write retries
            self.log.error("disk full: cannot write status.json (state %s); %s", self.status.state,
                           space.describe(self.run_dir))

    # -- signals ---------------------------------------------------------------------------
    def _on_stop(self, signum: int, _frame: Any) -> None:
        self.stop_requested = True
        if self.slurm.stop_signal(signum) and self.torchrun is not None and self.torchrun.poll() is None:
            self.torchrun.send_signal(signal.SIGTERM)

    def _on_kill(self, _signum: int, _frame: Any) -> None:
        self.kill_requested = True

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal must not end the run
        signal.signal(signal.SIGUSR1, self._on_kill)

    # -- the attempts ----------------------------------------------------------------------
    def run(self) -> int:
        """Attempt after attempt; returns the supervisor's exit code (0 ok, 1 failed/killed)."""
        self.install_signals()
        # the GPUs its ranks say they use (their heartbeats), sampled alone: another job's GPUs are not this run's
        self.sampler = SystemSampler(heartbeats=self.paths, expect=self.cfg.launch.nproc_per_node)
        if not space.ensure_reserve(self.paths.reserve):
            self.log.warning("no room for the %s reserve: %s", fmt.human_bytes(space.RESERVE_BYTES), space.describe(self.run_dir))
        if not self.sampler.gpus.ok:
            self.log.info("NVML not available (%s): no GPU readings, sampling CPU only",
                          self.sampler.gpus.error)
        # one writer of incidents.jsonl: the job's supervisor, whose rules hear the other nodes' failures
        self.incidents = IncidentHook(self.run_dir, self.cfg, self.log, node=self.node, rules=self.is_job, job=self.job)
        restarts_left = self.cfg.launch.max_restarts
        attempt = next_attempt(self.status, self.is_job)
        self.incidents.catch_up(self.slurm.progress.feed(self.events.iter_new()))  # earlier attempts: history, not news
        lost = self.slurm.lost_before(self.status)
        if lost is not None:
            self.log.warning("%s", lost.detail)
            self.incidents.note(lost, "the attempt it concerns had ended")
        self.mirrors = MirrorHook(self.paths, self.cfg, self.log, self.events.line_offset)  # [monitor] tensorboard, wandb
        self.notify = NotifyHook(self.paths, self.cfg, self.log)   # [monitor] notify: a thread of its own
        try:
            if refused := node_device_problem(self.cfg, self.under_slurm):
                return self.finish("failed", 1, exit_code=None, reason=refused)
            while True:
                rc, worker_rc, run_end = self.run_attempt(attempt)
                if self.lost:  # nothing to record: the folder is not this run's any more
                    return 1
                if self.kill_requested:
                    return self.finish("killed", 1, exit_code=None, reason="killed by mt kill")
                ended = run_end.status if run_end else None
                if ended == rollback.RUN_END and rc == 0 and not self.stop_requested:  # on_nan/on_spike: the next
                    attempt += 1   # attempt makes the rollback the engine asked for (rollback.json); no restart spent
                    continue
                # torchrun exits 1 after a forwarded SIGTERM however cleanly workers stopped: run_end says how (an ended hang failed)
                if not self.hung and (rc == 0 or ended in CLEAN_STATES):
                    state = ended if ended in CLEAN_STATES else \
                        ("stopped" if self.stop_requested else "completed")
                    return self.finish(state, 0, exit_code=rc, reason=(run_end.reason if run_end else "") or state)
                reason = self.failure_reason(rc, worker_rc, run_end)
                if self.stop_requested and self.cfg.launch.script and run_end is None and not self.hung:
                    # a script that does not use mt dies of the SIGTERM we forwarded: that is its stop
                    return self.finish("stopped", 0, exit_code=rc, reason="stopped by SIGTERM (the script reports "
                                       "nothing through mt, so it saved no final checkpoint for mt)")
                if self.stop_requested:
                    return self.finish("failed", 1, exit_code=rc, reason=reason)
                if worker_rc == 2:
                    # bad config, a refused resume, a full disk: another attempt would fail the same way
                    return self.finish("failed", 1, exit_code=rc, reason=reason)
                if restarts_left > 0:
                    restarts_left -= 1
                    self.log.info("attempt %d failed (%s); restarting from %s (%d restarts left)", attempt, reason,
                                  newest(self.paths.checkpoints, "sizes").path or "the beginning", restarts_left)
                    self.status.restarts_left = restarts_left
                    attempt += 1
                    continue
                return self.finish("failed", 1, exit_code=rc, reason=reason)
        finally:
            self.sampler.close()
            if not self.is_job:  # srun's --kill-on-bad-exit must not end the job's supervisor mid-record
                self.peers.wait_for_job_end(JOB_END_WAIT_S)
            self.mirrors.close()
            self.notify.close()

    def failure_reason(self, rc: int, worker_rc: int | None, run_end: RunEnd | None) -> str:
        return self.hung or attempt_failure(self.cfg, self.paths, rc, worker_rc, run_end, self.peers.killed_elsewhere(self.status.attempt))

    def run_attempt(self, attempt: int) -> tuple[int, int | None, RunEnd | None]:
        """One torchrun (or the one worker itself: `direct`); returns (its exit code, the first worker's, the run_end)."""
        started = time.time()
        st, launch = self.status, self.cfg.launch
        st.attempt, st.torchrun_pid, st.worker_pids, st.started = attempt, None, {}, st.started or started
        st.ended, st.exit_code, st.reason, st.failures, st.slurm_state = None, None, None, [], None
        st.nproc, st.nnodes, st.node_rank, st.direct = launch.nproc_per_node, launch.nnodes, launch.node_rank, is_direct(self.cfg)
        self.write_status("starting", f"attempt {attempt}")
        if self.kill_requested or self.stop_requested:  # a signal arrived before torchrun started
            return (-signal.SIGTERM, None, RunEnd(t=time.time(), raw={}, status="stopped", reason="stopped before start"))
        self.current_attempt, self.hung = None, None
        log_path = self.paths.logs / "torchrun.log"
        log_offset = log_path.stat().st_size if log_path.exists() else 0
        # torchrun's scratch, removed when the attempt ends (torchrun itself never removes it)
        scratch = None if is_direct(self.cfg) else Path(tempfile.mkdtemp(prefix="mt-torchrun-"))
        try:
            return self._attempt(attempt, started, log_path, log_offset, scratch)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def _attempt(self, attempt: int, started: float, log_path: Path, log_offset: int,
                 scratch: Path | None) -> tuple[int, int | None, RunEnd | None]:
        cmd = attempt_command(self.cfg, self.run_dir, attempt, log_dir=scratch, node=self.role)
        if not self.is_job and not self.peers.wait_for_job_attempt(attempt, JOB_START_WAIT_S):
            why = f"node {self.node}: the job's supervisor did not start attempt {attempt} in {JOB_START_WAIT_S:.0f} s"
            return (1, None, RunEnd(t=time.time(), raw={}, status="failed", reason=why))
        self.log.info("attempt %d: %s", attempt, " ".join(cmd))
        # one process: no torchrun agent hosts the group's store, so its worker serves one on a
        # loopback socket bound here (a free port, no race; engine/direct.py)
        store = socket.create_server(("127.0.0.1", 0), backlog=256) if is_direct(self.cfg) else None
        with os.fdopen(door.open_append(log_path), "ab") as out, store or contextlib.nullcontext():
            self.torchrun = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=worker_env(self.cfg, store=store, attempt=attempt, node=self.node, flight_dir=self.paths.flight),
                preexec_fn=die_with_parent, close_fds=True, pass_fds=(store.fileno(),) if store else (), cwd=self.script_cwd(),
            )
        tr = self.torchrun
        record = {"attempt": attempt, "started": started, "torchrun_pid": tr.pid, "ended": None, "exit_code": None,
                  **self.slurm.attempt_keys()}
        self.status.attempts.append(record)
        self.status.torchrun_pid = tr.pid
        self.write_status("running", f"torchrun pid {tr.pid}")
        if self.stop_requested and not self.kill_requested:
            tr.send_signal(signal.SIGTERM)  # a stop that raced the start (a kill's is the watch's first act)
        run_end = self.watch(attempt, tr)
        rc = tr.returncode
        record.update(ended=time.time(), exit_code=rc)
        worker_rc = (rc if is_direct(self.cfg) else worker_exit_code(log_path, log_offset)) if rc else None
        clean = run_end is not None and run_end.status in CLEAN_STATES and not self.hung
        if not self.kill_requested and not clean:
            self.status.exit_code = rc
        if self.node is not None and rc and not is_direct(self.cfg):
            # what the job's supervisor needs to name the rank and node that failed first
            record["failures"] = self.status.failures = failures_since(log_path, log_offset)
            if self.is_job:
                self.peers.wait_for_attempt_end(attempt, PEER_WAIT_S, self.while_peers_report)
            else:
                self.status.reason = self.failure_reason(rc, worker_rc, run_end)
                self.save_status()
        # a kill, or a stop that torchrun reports as exit 1, is not a crash for the rules
        if (rc or self.hung) and not self.kill_requested and not clean and not self.lost:
            if self.status.slurm_state != "NODE_FAIL":   # Slurm's word on a lost node says more than its peer's error
                self.status.reason = self.failure_reason(rc, worker_rc, run_end)
            self.save_status()
            self.tick()  # let the rules classify the crash (crash, oom, ...) now
        self.reap_leftovers()
        return rc, worker_rc, run_end

    def script_cwd(self) -> str | None:
        """A script runs where `mt launch` ran, as it would by hand (its relative paths hold)."""
        workdir = self.cfg.run.workdir
        return workdir if self.cfg.launch.script and workdir and os.path.isdir(workdir) else None

    def watch(self, attempt: int, tr: subprocess.Popen[bytes]) -> RunEnd | None:
        """Sample, diagnose and follow events until torchrun exits; returns this attempt's run_end."""
        self.ranks = {}
        run_end, kill_deadline = None, None   # this attempt's run_end; when a kill's SIGKILL is due
        next_tick, since = time.monotonic(), time.time()
        while tr.poll() is None:
            now = time.monotonic()
            if self.kill_requested and kill_deadline is None:   # mt kill signals all itself; this covers a lone SIGUSR1
                self.stopping("kill requested")   # before the next tick: the rules never read the dying ranks as a crash
                kill_deadline = now + 15.0
                procs.send_all(procs.others(self.run_dir, [tr.pid], self.node), procs.KILL_SIGNAL)   # never SIGTERM: a stop saves
            if kill_deadline is not None and now > kill_deadline:
                kill_all(procs.others(self.run_dir, [tr.pid], self.node))
            run_end = self.follow_events(attempt) or run_end
            if now >= next_tick:
                next_tick = now + self.poll_s
                if self.check_dir(tr):
                    break
                if len(self.ranks) < self.cfg.launch.nproc_per_node:
                    found = {0: tr.pid} if is_direct(self.cfg) else {r: p.pid for r, p in rank_processes(tr.pid).items()}
                    if found != self.ranks:
                        self.ranks = found
                        self.status.worker_pids = {str(r): p for r, p in found.items()}
                        self.write_status(self.status.state or "running", f"workers {dumps(self.status.worker_pids)}")
                # a job's other node samples its ranks' system calls too: the rules run on the job's node
                self.tick(self.sampler.append(self.ranks, self.paths.system, self.log, detail=not self.is_job))
                if self.is_job and not (self.hung or self.kill_requested or self.stop_requested):
                    self.hung = end_if_hung(self.incidents, self.cfg.monitor, since, self.stopping, self.paths, tr.pid)
            if self.stop_requested and self.status.state in ("running", "stopping"):
                if self.node_failed():
                    next_tick = now
                elif self.status.state == "running":
                    self.stopping("SIGTERM: graceful stop")
            try:
                tr.wait(timeout=min(0.25, self.poll_s))
            except subprocess.TimeoutExpired:
                pass
        return self.follow_events(attempt) or run_end

    def node_failed(self) -> bool:
        """Slurm's SIGTERM came because a node of the job failed or the job was requeued: recorded as soon
        as Slurm says it; True when just recorded, for the rules to run at once (KillWait is short)."""
        lost = self.slurm.node_failure() if self.stop_requested else None
        if lost is None or self.status.slurm_state == lost.slurm_state:
            return False
        self.status.slurm_state = lost.slurm_state
        self.stopping(lost.reason)
        return True

    def while_peers_report(self) -> bool:
        """Each poll while the job's supervisor waits for the other nodes to report a failed attempt: Slurm's
        word on a lost node, the samples and the rules go on; True (stop waiting): a node failed, it never reports."""
        now = time.monotonic()
        if self.node_failed() or now >= self.peer_tick:
            self.peer_tick = now + self.poll_s
            self.tick(self.sampler.append(self.ranks, self.paths.system, self.log, detail=False))
        return self.status.slurm_state == "NODE_FAIL"

    def check_dir(self, tr: subprocess.Popen[bytes]) -> bool:
        """If the run directory was deleted or replaced, end every process of the run; True then.

        Training on would write into a deleted folder, or into someone else's; readers and
        `mt kill` would see no run there, so the run cannot be stopped any other way."""
        self.lost = self.dir_watch.lost()
        if self.lost:
            self.log.error("%s; ending the run (nothing more is written there)", self.lost)
            # SIGKILL: a graceful stop would write its final checkpoint into whatever is there now
            kill_all(procs.others(self.run_dir, [tr.pid], self.node))
            tr.wait()
        return self.lost is not None

    def follow_events(self, attempt: int) -> RunEnd | None:
        """Read new events: note an accepted stop (state `stopping`) and this attempt's run_end."""
        run_end = None
        new = list(self.slurm.progress.feed(self.events.read_new()))
        self.news += new
        for ev in new:
            if isinstance(ev, ControlEvent) and ev.action == "stop" and ev.status == "accepted" \
                    and self.status.state == "running":
                self.stopping(f"stop requested ({ev.request_id})")
            elif isinstance(ev, RunStart):
                self.current_attempt = ev.attempt
            elif isinstance(ev, RunEnd) and self.current_attempt in (None, attempt):
                # None: the engine ended before run_start (bad data, refused resume)
                run_end = ev
        return run_end

    def stopping(self, reason: str) -> None:
        self.status.reason = reason
        self.write_status("stopping")

    def tick(self, sample: dict[str, Any] | None = None) -> None:
        """Hand the incident rules what this supervisor knows now: status, news, the sample."""
        news, self.news = self.news, []
        if self.lost:
            return
        self.incidents.poll(self.status, news, [] if sample is None else [sample], self.ranks)
        self.mirrors.poll(news, (self.events.line_offset, self.events.ino))
        self.notify.poll(self.status, news)

    def reap_leftovers(self) -> None:
        """After torchrun is gone, no worker of this run may survive it (orphans after SIGKILL)."""
        leftovers = [p for p in run_processes(self.run_dir, node=self.node) if p.pid != os.getpid()]
        if leftovers:
            self.log.warning("terminating %d leftover processes: %s", len(leftovers), [p.pid for p in leftovers])
            terminate_all(leftovers, grace_s=10.0, first=procs.KILL_SIGNAL if self.kill_requested else signal.SIGTERM)  # a kill saves nothing


if __name__ == "__main__":   # its process moved beside it: say where, rather than do nothing
    raise SystemExit("mt: the supervisor runs as python -m tui.supervise.supervisor_main --run-dir DIR [--daemon | --slurm]")
