"""Supervising a run: launch, the supervisor process, torchrun, the ranks' processes, system sampling, control requests, the lock."""
