"""`calcx train`'s driver process: the command, the rollout services it starts, the run's lease,
resume and settings, progress, the eval-only driver and the report."""
