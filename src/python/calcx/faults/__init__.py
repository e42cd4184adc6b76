"""The fault suite: what a calcx rehearsal survives, as importable modules.

`hostile` (inputs and a hostile HTTP client), `proxy` (the fault proxy in front of the stub
LLM), `plan` (rows with planned faults), `forensics` (agents and calculators found under a
controller), `injector` (kills and restarts), `audit` (what the store must show afterwards),
`run` (a whole fault run) and `report` (its Markdown page). benchmarks/faults.py runs it and
tests/faults checks it; docs/faults.md says how the faults are made.
"""
