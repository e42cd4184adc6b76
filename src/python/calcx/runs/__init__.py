"""Runs as records: each committed GPU run is a folder `results/runs/<date>-<name>/` whose
`run.yaml` says what ran (commit, artifact sha256, command, profile, machine, data sets and their
sizes) beside its metrics; `calcx runs index` makes results/INDEX.md from those files. `calcx runs
table` and `calcx runs curves` make a run's figures: its step tables (from its metrics and its
store) and pictures of runs side by side."""
