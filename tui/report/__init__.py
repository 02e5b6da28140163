"""Plain text out: `mt watch --once`, the `mt ls` table, `mt diff`, the `--headless` follower."""
