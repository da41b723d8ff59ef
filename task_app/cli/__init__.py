"""`task-app ...`: the command-line entry points (serve, demo, eval, traces, replay, view)."""
