"""Which dashboard layout a terminal size gets, and which panels are tabs in it. Pure."""
from __future__ import annotations

from dataclasses import dataclass

MIN_W, MIN_H = 60, 16        # below this nothing useful fits: say so instead of drawing garbage
TABS_BELOW = (100, 28)       # narrower or lower than this: one pane at a time, a strip of tabs
SIDE_TABS_BELOW = (120, 36)  # ...than this: the plots, and one side panel at a time beside them

# tab number -> (name on the strip, what it shows); 5 only exists where the small plots are a tab
TAB_NAMES = {1: "loss", 2: "system", 3: "incidents", 4: "logs", 5: "lr · grad"}


def choose_layout(width: int, height: int) -> str:
    """`too-small`, `tabs` (80×24: the loss plot or one panel fills the screen), `side-tabs`
    (100×30: the plots beside one side panel) or `full` (120×40 and up: everything)."""
    if width < MIN_W or height < MIN_H:
        return "too-small"
    if width < TABS_BELOW[0] or height < TABS_BELOW[1]:
        return "tabs"
    if width < SIDE_TABS_BELOW[0] or height < SIDE_TABS_BELOW[1]:
        return "side-tabs"
    return "full"


def tabs_of(layout: str) -> tuple[int, ...]:
    """The tabs a layout switches between (none where everything is on screen)."""
    return {"tabs": (1, 2, 3, 4, 5), "side-tabs": (2, 3, 4)}.get(layout, ())


@dataclass(frozen=True)
class Tabs:
    """The tab shown in each tabbed layout (kept across resizes)."""

    tabs: int = 1        # in `tabs`
    side: int = 2        # in `side-tabs`

    def active(self, layout: str) -> int | None:
        return self.tabs if layout == "tabs" else self.side if layout == "side-tabs" else None

    def select(self, layout: str, n: int) -> Tabs:
        """Tab n where the layout has it; `1` in `side-tabs` (the plots are always there) keeps the side."""
        if n not in tabs_of(layout):
            return self
        return Tabs(n, self.side) if layout == "tabs" else Tabs(self.tabs, n)

    def next(self, layout: str) -> Tabs:
        """Tab: the next tab of the layout, in the strip's order, round."""
        order = tabs_of(layout)
        now = self.active(layout)
        if not order or now is None:
            return self
        return self.select(layout, order[(order.index(now) + 1) % len(order)] if now in order else order[0])


def strip_items(layout: str, active: int | None, open_incidents: int) -> list[tuple[str, bool]]:
    """(label, is the active tab) for the one-line tab strip; empty where there are no tabs."""
    items = []
    for n in tabs_of(layout):
        name = TAB_NAMES[n]
        if n == 3 and open_incidents:
            name += f" ({open_incidents} open)"
        items.append((f"{n} {name}", n == active))
    return items
