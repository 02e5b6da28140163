"""File I/O into state: following a run directory, bulk and index reads of events.jsonl."""

# Size of events.jsonl from which the bulk read (index or column scan) beats line-by-line JSON. Kept
# here, free of imports, so that `mt ls` (which never loads numpy) and the bulk reader share it.
BULK_MIN_BYTES = 4 << 20
