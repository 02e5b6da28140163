"""Plain-text views: `mt watch --once`, the `mt ls` table, the `--headless` follower."""
