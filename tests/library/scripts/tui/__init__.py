"""A user's own tui/ package: mt must not import it."""
raise ImportError("the user's tui/ was imported by mt")
