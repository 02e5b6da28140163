"""Adapters that report the loops people already use to mt (each imports its framework itself)."""
