"""Tools that are not supervision: `mt prepare` (tokenizing text) and `mt doctor`."""
