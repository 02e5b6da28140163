"""Incident diagnosis: the rules (pure), the memory they keep between polls, the probes and the monitor."""
