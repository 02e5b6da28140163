"""A job's node that went away (NODE_FAIL, its supervisor and ranks killed): found from every
node's heartbeats and samples, so the incident names it and not the survivor that lost its peer."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mt.contract.events import as_float
from mt.contract.incident import Incident
from mt.contract.status import CLEAN_STATES
from tui.diagnose.findings import Observation
from tui.diagnose.hang import this_attempt
from tui.diagnose.memory import RuleMemory
from tui.format.fmt import at_step, fmt_ranks, fmt_s, safe_text

LOST_QUIET_S = 5.0   # a live node's supervisor samples once a second: five missed samples and no heartbeat
ADVICE_NODE_LOST = (
    "A node of the job went away (a node failure, its power or kernel, or its supervisor and ranks "
    "killed): the collective errors on the other nodes only follow from it. Check that node "
    "(`scontrol show node`, `sinfo -R`, its kernel log), leave it out if it fails again "
    "(sbatch --exclude), and `mt resume` from the newest checkpoint (a Slurm job with --requeue "
    "is restarted by Slurm itself)."
)


@dataclass
class LostNode:
    """A node whose ranks stopped first and said nothing, its supervisor recording no end."""

    node: str
    ranks: list[int]
    last_step: int | None       # its ranks' newest heartbeat step
    last_seen_t: float          # its newest heartbeat or system sample
    state: str | None           # what its status.json last said (None: no status)

    def fields(self, others_t: float) -> dict[str, Any]:
        return {"node": self.node, "ranks": self.ranks, "last_heartbeat_step": self.last_step,
                "state": self.state, "quiet_before_others_s": round(others_t - self.last_seen_t, 1)}


def _last_seen(memory: RuleMemory, hbs: dict[int, dict[str, Any]], ranks: list[int], node: str) -> float:
    """The node's newest sign of life: a heartbeat of its ranks, or its supervisor's system sample."""
    marks = [as_float(hbs[r].get("t")) for r in ranks if r in hbs]
    sample = memory.newest_system(node)
    if sample is not None:
        marks.append(as_float(sample.get("t")))
    marks = [t for t in marks if math.isfinite(t)]
    return max(marks) if marks else -math.inf


@dataclass
class Quiet:
    """The job's silent nodes: lost, or `waiting`: quiet not long enough yet, or a rank of one has gone
    (its supervisor records why in a moment)."""

    lost: list[LostNode]
    waiting: bool
    others_t: float             # the other nodes' newest sign of life


def lost_nodes(memory: RuleMemory, obs: Observation, blamed: str | None, said: dict[int, str | None]) -> Quiet:
    """Nodes other than `blamed` (the node of the rank that lost its peer) whose ranks logged nothing
    (`said`: rank -> its log's verdict), whose supervisor recorded no failed worker and no clean end,
    and whose heartbeats and samples stopped before the others': lost once quiet LOST_QUIET_S, or
    at once when Slurm said a node failed."""
    hbs = this_attempt(memory, obs)
    by_node: dict[str, list[int]] = {}
    for rank, node in sorted(obs.nodes.items()):
        by_node.setdefault(node, []).append(rank)
    quiet, seen = [], {}
    for node, ranks in by_node.items():
        seen[node] = _last_seen(memory, hbs, ranks, node)
        gone = obs.node_exits.get(node)
        if (node == blamed or not any(r in hbs for r in ranks) or (gone is not None and gone.failures)
                or obs.node_states.get(node) in CLEAN_STATES):
            continue
        # a rank that lost its peer, or was asked to stop, is a survivor too (a network failure)
        if any(said.get(r) is not None for r in ranks):
            continue
        steps = [int(as_float(hbs[r].get("step"))) for r in ranks if r in hbs and math.isfinite(as_float(hbs[r].get("step")))]
        quiet.append(LostNode(node, ranks, max(steps) if steps else None, seen[node], obs.node_states.get(node)))
    others = max((t for n, t in seen.items() if n not in {q.node for q in quiet}), default=-math.inf)
    first = [q for q in quiet if q.last_seen_t < others]
    # a rank killed on a node whose supervisor lives is recorded there within a second or two
    # (its failures, then the crash names it): until then a quiet node is only maybe lost
    sure = obs.status.slurm_state == "NODE_FAIL"
    lost = [q for q in first if sure or obs.now - q.last_seen_t >= LOST_QUIET_S]
    # a live node whose sample shows a rank gone: its supervisor is about to record that failure
    dying = any(obs.procs.get(r) is not None and obs.procs[r].alive is False for q in quiet for r in q.ranks)
    return Quiet(lost, (bool(first) or dying) and not lost, others)


def node_lost(lost: list[LostNode], others_t: float, step: int | None, survivor: str, what: str,
              evidence: dict[str, Any]) -> Incident:
    """The one incident for a lost node: it names the node and its ranks; the survivor's collective
    error (`what`, of `survivor`) is its consequence, in the detail and the evidence."""
    first = lost[0]
    if first.last_step is not None and step is not None:
        step = min(step, first.last_step + 1)   # the step the node did not finish: the survivors may have taken more
    names = ", ".join(f"node {safe_text(q.node)}" for q in lost)
    ranks = [r for q in lost for r in q.ranks]
    title = f"Node lost: {names} ({fmt_ranks(ranks)}) {at_step(step)}"
    said = "no status" if first.state is None else f"status {first.state}"
    last = "" if first.last_step is None else f"at step {first.last_step:,}"
    detail = (f"{names} stopped first: its heartbeats ended {last}, {fmt_s(others_t - first.last_seen_t)} before "
              f"the other nodes' last sign of life, its ranks' logs show no error and its supervisor recorded "
              f"no end ({said}); {survivor} then {what} (a consequence of the lost node, not a cause)")
    evidence = {**evidence, "rank": ranks[0], "node": first.node, "exit_code": None, "pid": None, "signal": None,
                "line": None, "source": "every node's heartbeats and system samples",
                "lost_nodes": [q.fields(others_t) for q in lost]}
    return Incident("crash", "error", step, title, detail.replace("  ", " "), ADVICE_NODE_LOST, evidence)
