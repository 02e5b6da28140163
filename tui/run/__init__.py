"""Running a run: launch, the supervisor, torchrun, processes, system sampling, control requests."""
