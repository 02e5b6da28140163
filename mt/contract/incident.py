"""The incident: the one shape every rule builds, every writer writes and every reader reads back.

Rank 0's rules inside training (mt/rules.py) and the supervisor's (tui/diagnose/) each return an
`Incident`; the engine writes it as an `incident` event, the supervisor's monitor as a line of
incidents.jsonl. The one parser (mt/contract/records.py) reads either line back as an
`IncidentLine`, which the viewer keeps (tui/state/runstate.py). docs/events.md#incident.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from mt.contract.events import SCHEMA_VERSION


@dataclass(slots=True)
class Incident:
    """What a rule found: the fields every `incident` event and incidents.jsonl line carry."""

    code: str                 # INCIDENT_CODES (mt/contract/events.py)
    severity: str             # SEVERITIES: info, warn, error
    step: int | None          # the step it concerns; None: before the first step, or no step at all
    title: str
    detail: str = ""
    advice: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The fields in incidents.jsonl's order (code first)."""
        return {"code": self.code, "severity": self.severity, "step": self.step, "title": self.title,
                "detail": self.detail, "advice": self.advice, "evidence": self.evidence}

    def event_fields(self) -> dict[str, Any]:
        """The fields in the `incident` event's order (step first): `emit("incident", **inc.event_fields())`.
        Two orders, because the bytes runs already hold must not change (docs/events.md)."""
        return {"step": self.step, "code": self.code, "severity": self.severity, "title": self.title,
                "detail": self.detail, "advice": self.advice, "evidence": self.evidence}

    def filed(self, t: float, source: str) -> dict[str, Any]:
        """The `open` line of incidents.jsonl that files it, written by `source` (engine, supervisor) at `t`."""
        return {"v": SCHEMA_VERSION, "t": t, **self.fields(), "status": "open", "source": source}


@dataclass(slots=True)
class IncidentLine(Incident):
    """An incident as a line holds it: an `incident` event, or a line of incidents.jsonl (which adds
    status and source). The viewer keeps its own copy of each, open until a `closed` line."""

    t: float | None = None
    status: str = "open"            # open | update (more evidence for the open one) | closed
    source: str | None = None       # engine | supervisor (incidents.jsonl only)
    event_t: float | None = None    # when the engine raised a copied incident
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    kind: ClassVar[str] = "incident"
