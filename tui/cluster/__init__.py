"""Slurm and multi-node: the batch script, preemption and requeue, the peers of a job, its nodes and the lost-node rule."""
