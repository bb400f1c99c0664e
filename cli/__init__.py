"""The operator commands of `curvine`: fs, report, journal, config (main.py dispatches;
connect.py is how each reaches its cluster).  `curvine local|demo|bench` are
development tooling, in curvine.devtools."""
