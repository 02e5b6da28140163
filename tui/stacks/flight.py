"""PyTorch's flight-recorder dumps, read without running them, and who did not join (pure).

torch writes a dump with its C++ pickler from dicts, lists, tuples, str, int, float, bool and None
only (torch 2.13, FlightRecorderDetail.hpp `dump`): `_PlainUnpickler` builds just those and refuses
every global, so a pickle dropped into flight/ cannot run code. The analysis is the part of torch's
`fr_trace` mt used: per process group, the first collective (by `collective_seq_id`) some member
ranks never entered while others did.
"""
from __future__ import annotations

import io
import pickle
import re
from dataclasses import dataclass
from typing import Any


class NotADump(ValueError):
    """Bytes that are not a flight-recorder dump mt will read: a global in the pickle, or the wrong shape."""


@dataclass(frozen=True)
class Unjoined:
    """One collective some ranks of its group never entered: its sequence number, op and group."""

    seq: int
    op: str
    group: str
    missing: tuple[int, ...]
    expected: tuple[int, ...]
    state: str
    waiting: tuple[int, ...] = ()   # the ranks whose dumps show they entered it (default: expected - missing)

    def line(self) -> str:
        """`rank 1 did not join collective #4 (nccl:all_reduce, group 0:default_pg); rank 0 waits in it`."""
        who = ("rank " if len(self.missing) == 1 else "ranks ") + ", ".join(map(str, self.missing))
        rest = self.waiting or tuple(r for r in self.expected if r not in self.missing)
        waits = f"; {'rank' if len(rest) == 1 else 'ranks'} {', '.join(map(str, rest))} {'waits' if len(rest) == 1 else 'wait'} in it" if rest else ""
        return f"{who} did not join collective #{self.seq} ({self.op}, group {self.group}){waits}"


@dataclass(frozen=True)
class Entry:
    """One recorded collective of a rank: what the analysis uses of a dump's entry."""

    record_id: int
    group: str       # the process group's name (pg_config's key on NCCL)
    desc: str        # its description: default_pg, or the user's
    seq: int         # collective_seq_id: the group's own count of collectives
    op: str          # profiling_name, e.g. nccl:all_reduce
    state: str       # scheduled, started or completed


@dataclass(frozen=True)
class Dump:
    """One rank's dump: its collectives (p2p left out) and the member ranks of each group it names."""

    rank: int
    entries: tuple[Entry, ...]
    members: dict[str, tuple[int, ...]]
    wrapped: bool = False   # its ring buffer dropped older records: its first record is not record 0


class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle's own opcodes make (dict, list, tuple, str, bytes, int, float, bool,
    None, set); any class or function a pickle names is refused, so nothing of it runs."""

    def find_class(self, module: str, name: str) -> Any:
        raise NotADump(f"it names {module}.{name}; a flight-recorder dump holds plain values only")

    def persistent_load(self, pid: Any) -> Any:
        raise NotADump("it holds a persistent id; a flight-recorder dump holds plain values only")


def plain_unpickle(data: bytes) -> Any:
    """The value of a pickle of plain values; NotADump for any other pickle or garbage."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except NotADump:
        raise
    except Exception as e:  # noqa: BLE001 - a torn or hostile pickle raises anything from EOFError to MemoryError
        raise NotADump(f"not a pickle ({type(e).__name__}: {str(e)[:120]})") from None


def _get(d: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = d.get(key) if isinstance(d, dict) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise NotADump(f"{where}.{key} is missing or not {getattr(kind, '__name__', 'a sequence')}")
    return value


def _entry(e: Any, where: str) -> tuple[int, Entry | None]:
    """(record_id, the entry), the entry None for send/recv: peers match those, not the group's count."""
    record_id = _get(e, "record_id", int, where)
    if e.get("is_p2p") is True:
        return record_id, None
    pg = _get(e, "process_group", (tuple, list), where)
    if len(pg) != 2 or not all(isinstance(x, str) for x in pg):
        raise NotADump(f"{where}.process_group is not (name, desc)")
    return record_id, Entry(record_id, pg[0], pg[1], _get(e, "collective_seq_id", int, where),
                            _get(e, "profiling_name", str, where), _get(e, "state", str, where))


def _members(pg_config: Any) -> dict[str, tuple[int, ...]]:
    """Group name -> member ranks; torch writes the ranks as the text `[0, 1]`, read here as numbers (never eval'd)."""
    if not isinstance(pg_config, dict):
        raise NotADump("pg_config is not a dict")
    out = {}
    for key, info in pg_config.items():
        ranks = _get(info, "ranks", str, f"pg_config[{key!r}]")
        out[str(key)] = tuple(sorted({int(n) for n in re.findall(r"\d{1,9}", ranks)}))
    return out


def load_dump(data: bytes, rank: int) -> Dump:
    """Rank `rank`'s dump from its bytes; NotADump names what is wrong."""
    value = plain_unpickle(data)
    if not isinstance(value, dict):
        raise NotADump(f"a {type(value).__name__}, not a dump's dict")
    raw = value.get("entries", [])   # absent when torch dumped without collectives
    if not isinstance(raw, list):
        raise NotADump("entries is not a list")
    read = [_entry(e, f"entries[{i}]") for i, e in enumerate(raw)]
    entries = tuple(e for _, e in read if e is not None)
    return Dump(rank, entries, _members(value.get("pg_config", {})), wrapped=bool(read) and read[0][0] != 0)


def _group_members(group: str, dumps: list[Dump], reach: dict[int, dict[str, int]]) -> tuple[int, ...]:
    """The group's ranks from a dump's pg_config; gloo's dumps (torch 2.13) key their one group ''
    instead of by name: a lone entry then stands for it; else the ranks that recorded the group."""
    for d in dumps:
        if group in d.members:
            return d.members[group]
    for d in dumps:
        if len(d.members) == 1:
            return next(iter(d.members.values()))
    return tuple(sorted(r for r, groups in reach.items() if group in groups))


def unjoined(dumps: list[Dump]) -> list[Unjoined]:
    """Per process group, the first collective some dumped members never entered while others did.

    A rank's ring buffer keeps its newest collectives, so its highest seq in a group is where it got
    to; a rank whose buffer holds none of the group counts only if its buffer never wrapped (its
    first record is record 0). Ranks without a dump are never blamed, as fr_trace's partial mode.
    """
    reach: dict[int, dict[str, int]] = {}          # rank -> group -> its highest seq there
    at: dict[tuple[int, str, int], Entry] = {}      # (rank, group, seq) -> its entry
    for d in dumps:
        mine = reach.setdefault(d.rank, {})
        for e in d.entries:
            mine[e.group] = max(mine.get(e.group, e.seq), e.seq)
            at.setdefault((d.rank, e.group, e.seq), e)
    found = []
    for group, desc in sorted({(e.group, e.desc) for d in dumps for e in d.entries}):
        inside = set(_group_members(group, dumps, reach))
        reached = {d.rank: reach[d.rank].get(group, 0) for d in dumps
                   if d.rank in inside and (group in reach[d.rank] or not d.wrapped)}
        if len(set(reached.values())) < 2:
            continue
        seq = min(reached.values()) + 1   # the first collective the laggards never entered
        missing = tuple(sorted(r for r, s in reached.items() if s < seq))
        waiting = tuple(sorted(r for r, s in reached.items() if s >= seq))
        first = at.get((waiting[0], group, seq))
        label = f"{group}:{desc}" if desc != "undefined" else group
        found.append(Unjoined(seq, first.op if first else "?", label, missing, tuple(sorted(inside)),
                              first.state if first else "?", waiting))
    return found
