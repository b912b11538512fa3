"""``clover-local compare``: the same tasks through several models on this machine, latency and accuracy side by
side. The core (tasks files, checks, statistics, the report) is plain Python; ``runner`` loads each local
contender through ``launch.open_launch``, one at a time, and ``endpoint`` talks to a model someone already runs."""
