"""The validation table of a run, from the server's rollouts: the last validation step, picked by
the partition and step labels the trainer creates its rollouts with (never by parsing ids)."""

from __future__ import annotations

from calcx.api.models import Rollout
from calcx.trainer.rollouts.group import RolloutOrigin
from calcx.trainer.run.evaluation import eval_collection


def _rollout(
    rid: str, origin: RolloutOrigin | None, state: str, reward: float | None, source: str = "gsm8k"
) -> Rollout:
    return Rollout.model_validate(
        {
            "rollout_id": rid,
            "row": {"source": source, "id": rid},
            "state": state,
            "reward": reward,
            "labels": origin.labels("run-1") if origin else {},
            "created_at": 1.0,
            "attempts": [{"attempt_id": "1", "state": state, "created_at": 1.0}],
        }
    )


def test_eval_collection_takes_the_last_validation_step() -> None:
    val0, val10 = RolloutOrigin("val", 0), RolloutOrigin("val", 10)
    rollouts = [
        _rollout("a", val0, "SUCCEEDED", 0.0),
        _rollout("b", RolloutOrigin("train", 11), "SUCCEEDED", 1.0),
        _rollout("c", val10, "SUCCEEDED", 1.0, "svamp"),
        _rollout("d", val10, "FAILED", None),
        # named like a validation rollout, but made by someone else: no labels, not in the table
        _rollout("calcx-val-s12-u5-0", None, "SUCCEEDED", 1.0),
    ]
    c = eval_collection(rollouts)
    assert c.step == 10 and [(x["source"], x["reward"]) for x in c.records] == [("svamp", 1.0)]
    assert len(c.unscored) == 1 and "1 not scored (FAILED 1)" in c.note()
    assert eval_collection(rollouts, step=0).records[0]["reward"] == 0.0
    assert eval_collection([]).step is None
