"""Incident diagnosis: the rules (pure), the signals they read, the probes and the monitor."""
