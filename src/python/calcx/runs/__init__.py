"""Runs as records: each committed GPU run is a folder `results/runs/<date>-<name>/` whose
`run.yaml` says what ran (commit, artifact sha256, command, profile, machine, data sets and their
sizes) beside its metrics; `calcx runs index` makes results/INDEX.md from those files."""
