"""The labels a trainer rollout carries, which the server, the trainer and the GPU run's tables read.

`RUN_LABEL` names the training run (`calcx train` sets it to `trainer.experiment_name`; the cancel
API and the training ledger find a run's rollouts by it); `PARTITION_LABEL` (`train` or `val`) and
`STEP_LABEL` (the training step, as decimal text) say what the rollout was made for.
"""

RUN_LABEL = "run"
PARTITION_LABEL = "partition"
STEP_LABEL = "step"
