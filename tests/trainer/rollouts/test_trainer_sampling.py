"""The trainer owns sampling for the rollouts it creates: a training session's rollouts get
`actor_rollout_ref.rollout`'s temperature/top_p/top_k, a validation session's get `val_kwargs`'
(greedy by default), as the sampling parameters the gateway applies to every model call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calcx.api.models import RolloutCreate
from calcx.trainer.config.compose import ComposeRequest, compose
from calcx.trainer.rollouts.session import session_spec

ROW = {"id": "q1", "question": "What is 2 + 2 ?", "chain": "", "result": "4", "source": "t"}
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}


def specs(*dotlist: str) -> tuple[Any, Any]:
    """(train spec, validation spec) of one session each, as the AgentLoop builds them."""
    cfg = compose(ComposeRequest(dotlist=list(dotlist)))
    rollout = cfg.actor_rollout_ref.rollout
    kwargs = {"uid": "u1", "session_id": 0, "global_steps": 3, "calcx_row": json.dumps(ROW)}
    train = session_spec(cfg.calcx, rollout, {"temperature": float(rollout.temperature)}, kwargs)
    val = session_spec(cfg.calcx, rollout, {}, {**kwargs, "validate": True})
    assert (train.partition, val.partition) == ("train", "val")
    return train, val


def sent_sampling(spec: Any) -> list[dict[str, Any]]:
    """The sampling of every rollout the session creates, as the server validates and stores it."""
    return [RolloutCreate.model_validate(body).model_dump(mode="json")["sampling"] for body in spec.bodies()]


def test_defaults_train_at_the_rollout_settings_and_validate_greedily() -> None:
    train, val = specs("actor_rollout_ref.rollout.n=4")
    # verl's defaults: rollout temperature 1, top_p 1, top_k -1 (off, sent as vLLM's 0)
    assert sent_sampling(train) == [{"temperature": 1.0, "top_p": 1.0, "top_k": 0}] * 4
    # val_kwargs: do_sample false -> greedy
    assert sent_sampling(val) == [GREEDY]


def test_changed_rollout_and_val_kwargs_settings_reach_the_rollouts() -> None:
    train, val = specs(
        "actor_rollout_ref.rollout.temperature=0.8",
        "actor_rollout_ref.rollout.top_p=0.95",
        "actor_rollout_ref.rollout.top_k=40",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
        "actor_rollout_ref.rollout.val_kwargs.top_p=0.9",
        "actor_rollout_ref.rollout.val_kwargs.top_k=20",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
    )
    assert sent_sampling(train) == [{"temperature": 0.8, "top_p": 0.95, "top_k": 40}] * 4
    assert sent_sampling(val) == [{"temperature": 0.6, "top_p": 0.9, "top_k": 20}] * 2


@pytest.mark.parametrize("top_k", ["-1", "0"])
def test_top_k_off_is_sent_as_zero(top_k: str) -> None:
    train, _ = specs(f"actor_rollout_ref.rollout.top_k={top_k}")
    assert sent_sampling(train)[0]["top_k"] == 0


def test_do_sample_false_is_greedy_whatever_the_val_temperature() -> None:
    _, val = specs(
        "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
        "actor_rollout_ref.rollout.val_kwargs.top_p=0.5",
        "actor_rollout_ref.rollout.val_kwargs.top_k=5",
    )
    assert sent_sampling(val) == [GREEDY]
