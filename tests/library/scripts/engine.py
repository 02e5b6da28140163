"""A user's own engine.py beside their script (torchvision's references have one)."""
MARK = "the user's own engine.py"
