"""The engine's checkpoints: `folder` (the atomic folder protocol and retention), `full` (torch.save
parts and the RNG), `sharded` (DCP), `saver` (what the loop calls), `pick` (where an attempt continues).

Names, the manifest, verification and which one is newest are mt/contract/checkpoints.py (stdlib).
"""
