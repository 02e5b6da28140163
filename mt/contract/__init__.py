"""The run-directory contract every part of mt shares: its files, their schema, how each is written and read. Stdlib only."""
