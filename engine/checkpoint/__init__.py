"""The engine's checkpoints: `folder` (the atomic folder protocol and retention), `full` (torch.save
parts and the RNG), `sharded` (DCP), `saver` (what the loop calls), `pick` (which checkpoint an attempt continues from), `resume`
(where an attempt starts: that checkpoint applied, init_from, or step 0).

Names, the manifest, verification and which one is newest are mt/contract/checkpoints.py (stdlib).
"""
