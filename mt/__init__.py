"""mt: the library a training script imports, and the contract every part of mt shares.

Stdlib only, and it never imports `engine` or `tui`: it runs inside a user's own process,
whose folder may hold modules of those names. Importing `mt` loads nothing else.
"""
