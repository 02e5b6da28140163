"""Pure state: events in, a `RunState` and plot series out (no I/O, no Textual)."""
