"""`python -m tui.cli`: the `mt` command."""
from tui.cli import main

main()
