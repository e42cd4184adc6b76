"""calcx.trainer: GRPO training of the Calc-X agent on verl 0.9.1, one sub-package per place its
code runs (docs/architecture.md, the package table):

- `run_dir`: the run's directory, as every process of a run reads and writes it;
- `rollouts`: rollouts on the calcx server into training samples (no verl, torch or ray);
- `config`: the composed config (code beside its YAML files; verl's YAML read, never imported);
- `workers`: what verl loads inside its Ray workers (agent loop, task runner, attention);
- `run`: the `calcx train` driver process;
- `warmup`: `calcx warmup`, the supervised warm-up.
"""
