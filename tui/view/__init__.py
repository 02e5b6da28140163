"""The two viewers: the dashboard of one run (app.py, dashboard.py) and the compare view of several
(compare.py, compare_screen.py), their shared keys and messages, and their stylesheets."""
