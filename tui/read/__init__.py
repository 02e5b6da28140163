"""File I/O into state: following a run directory, bulk and index reads of events.jsonl."""
