"""Stack capture and the flight recorder: taking every rank's stacks, the verdict over them, and NCCL's flight-recorder dumps."""
