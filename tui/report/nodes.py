"""A job's nodes and their ranks as lines: the dashboard's job panel, `--once` and `--headless`."""
from __future__ import annotations

from tui.format.fmt import NA, anatomy_text, fmt_duration, fmt_field, fmt_gib, fmt_num, or_na, safe_text
from tui.read.nodes import NodeView, RankView
from tui.state.runstate import RunState

STALE_BEAT_S = 10.0   # a heartbeat older than this is shown as stale (the hang rule has its own limit)


def _troubled(rv: RankView, now: float) -> bool:
    """Exited, or its heartbeat is stale: listed even where its node has no room for every rank."""
    age = rv.beat_age(now)
    return rv.alive is False or (age is not None and age >= STALE_BEAT_S)


def shown_step(rv: RankView, run: RunState | None) -> int | None:
    """A rank's step as shown: its heartbeat's, never behind the run's newest step event of the same
    attempt (every rank passed that step's collective; its beat lands after, or was read before)."""
    if rv.step is None or run is None or run.step is None or rv.attempt != run.attempt:
        return rv.step
    return max(rv.step, run.step)


def _rank_cell(rv: RankView, now: float, run: RunState | None) -> tuple[str, str]:
    """One rank's line under its node, and its style: red exited, yellow a stale heartbeat."""
    age = rv.beat_age(now)
    step = shown_step(rv, run)
    head = f"  r{rv.rank} step {NA if step is None else step} hb {fmt_duration(age)}"
    if rv.alive is False:
        return f"{head} pid {or_na(rv.pid)} exited", "red"
    text = f"{head} cpu {fmt_field(rv.cpu_pct, '.0f', '%')} {fmt_gib(rv.rss_bytes)}G pid {or_na(rv.pid)}"
    return text, "yellow" if age is not None and age >= STALE_BEAT_S else ""


def _node_head(view: NodeView, ranks: list[RankView], now: float, run: RunState | None) -> str:
    """A node in one line: state, ranks up, step range, oldest heartbeat, host CPU and GPUs."""
    up = sum(1 for r in ranks if r.alive is not False)
    steps = [s for s in (shown_step(r, run) for r in ranks) if s is not None]
    span = NA if not steps else str(min(steps)) if min(steps) == max(steps) else f"{min(steps)}-{max(steps)}"
    ages = [a for a in (r.beat_age(now) for r in ranks) if a is not None]
    s = view.sample or {}
    host = s.get("host") or {}
    utils = [g["util_pct"] for g in s.get("gpus") or [] if g.get("util_pct") is not None]
    gpu = f" gpu {fmt_num(sum(utils) / len(utils), '.0f')}%x{len(utils)}" if utils else ""
    state = or_na(view.status.state)
    return (f"{safe_text(view.name)[:14]} {state} {up}/{len(ranks)}r step {span} hb {fmt_duration(max(ages) if ages else None)}"
            f" cpu {fmt_field(host.get('cpu_pct'), '.0f', '%')}{gpu}")


def _anatomy_cell(rv: RankView) -> tuple[str, str] | None:
    """A live rank's step anatomy from its heartbeat, the line under its row (as the one-machine panel's)."""
    if rv.alive is False or "step_s" not in rv.anatomy:
        return None
    return f"    {anatomy_text(rv.anatomy, short=True)}", "dim"


def node_lines(views: list[NodeView], now: float, max_lines: int = 14,
               strays: list[str] | None = None, run: RunState | None = None) -> list[tuple[str, str]]:
    """Every node of a job, grouped: one line per node, then its ranks (each live one's step anatomy
    under it) where `max_lines` has room for all of them; else only the ranks that exited or went
    quiet. `strays`: folders under nodes/ that are not the job's, named once. `run`: the run's state,
    whose newest step event no rank's shown step is behind. (text, style) pairs."""
    if not views:
        return []
    ranks = {v.name: v.ranks() for v in views}
    total = sum(len(r) for r in ranks.values())
    rows = 1 + len(views) + total
    expand = rows <= max_lines
    under = {(v.name, rv.rank): _anatomy_cell(rv) for v in views for rv in ranks[v.name]} if expand else {}
    detail = rows + sum(1 for c in under.values() if c) <= max_lines
    out = [(f"job: {len(views)} nodes, {total} ranks", "bold")]
    for v in views:
        out.append((_node_head(v, ranks[v.name], now, run), "bold"))
        for rv in ranks[v.name]:
            if expand or _troubled(rv, now):
                out.append(_rank_cell(rv, now, run))
                cell = under.get((v.name, rv.rank)) if detail else None
                if cell:
                    out.append(cell)
    if strays:
        more = f" and {len(strays) - 5} more" if len(strays) > 5 else ""
        out.append((f"not part of this job (ignored): {', '.join('nodes/' + safe_text(n) for n in strays[:5])}{more}", "dim"))
    return out
