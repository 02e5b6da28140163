"""The two viewers: the dashboard of one run (app.py, dashboard.py) and the compare view of several
(compare.py), their shared keys and messages, and their stylesheets."""
