"""A rollout's `sampling`: validated at creation, stored and shown, and applied by the gateway to
every model call of the rollout over what the agent sent; rollouts without it pass through."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.api.models import RolloutCreate
from calcx.server.serve import start_server_thread
from calcx.server.store.schema import SCHEMA

ROW = {"question": "What is 2 + 2 ?", "result": "4"}
MESSAGES = [{"role": "user", "content": "What is 2 + 2 ?"}]
TRAINER = {"temperature": 0.0, "top_p": 0.9, "top_k": 0, "seed": 7}
# What an agent such as AutoGen may send on its own.
AGENT = {"temperature": 1.3, "top_p": 0.5, "presence_penalty": 0.1, "max_tokens": 10}


def create(sampling: Any) -> RolloutCreate:
    return RolloutCreate.model_validate({"rollout_id": "r", "row": ROW, "sampling": sampling})


@pytest.mark.parametrize(
    "sampling",
    [
        {},
        {"temperature": 0},
        {
            "temperature": 2,
            "top_p": 1,
            "top_k": -1,
            "min_p": 0,
            "repetition_penalty": 1.05,
            "presence_penalty": -2,
            "frequency_penalty": 2,
            "seed": -(2**63),
        },
        {"top_k": 0, "top_p": 0.01, "min_p": 1, "seed": 2**63 - 1},
    ],
)
def test_sampling_accepts_the_allowed_parameters_in_range(sampling: dict[str, Any]) -> None:
    spec = create(sampling)
    assert spec.sampling is not None
    assert spec.sampling.model_dump() == sampling  # only what was given, nothing filled in


@pytest.mark.parametrize(
    ("sampling", "where", "says"),
    [
        ({"temperature": -0.1}, "temperature", "greater than or equal to 0"),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"temperature": "0.7"}, "temperature", "valid number"),
        ({"temperature": True}, "temperature", "valid number"),
        ({"temperature": float("nan")}, "temperature", "finite number"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"top_p": 1.5}, "top_p", "less than or equal to 1"),
        ({"top_k": -2}, "top_k", "greater than or equal to -1"),
        ({"top_k": 40.0}, "top_k", "valid integer"),
        ({"min_p": 1.1}, "min_p", "less than or equal to 1"),
        ({"repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
        ({"presence_penalty": 2.1}, "presence_penalty", "less than or equal to 2"),
        ({"frequency_penalty": -3}, "frequency_penalty", "greater than or equal to -2"),
        ({"seed": 2**63}, "seed", "less than"),
        ({"seed": 1.5}, "seed", "valid integer"),
        ("hot", "sampling", "valid dictionary"),
    ],
)
def test_sampling_refuses_bad_types_and_ranges(sampling: Any, where: str, says: str) -> None:
    with pytest.raises(ValidationError) as err:
        create(sampling)
    (error,) = err.value.errors()
    assert error["loc"][-1] == where and says in error["msg"], error


def test_unknown_sampling_key_is_a_422_naming_it_and_the_allowed_ones(client: CalcxClient) -> None:
    with pytest.raises(CalcxAPIError) as err:
        client.create_rollouts(
            [
                {"rollout_id": "fine", "row": ROW},
                {"rollout_id": "typo", "row": ROW, "sampling": {"temprature": 0.0, "max_tokens": 5}},
            ]
        )
    assert err.value.status == 422 and err.value.code == "invalid_body"
    message = err.value.message
    assert "rollouts.1.sampling" in message and "'max_tokens', 'temprature'" in message, message
    assert (
        "allowed: temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, " "frequency_penalty, seed"
    ) in message, message
    with pytest.raises(CalcxAPIError) as missing:  # the batch was refused whole
        client.get_rollout("fine")
    assert missing.value.status == 404


def test_sampling_is_stored_shown_and_survives_a_restart(db_path: str, server_key: str) -> None:
    first = start_server_thread(db_path, server_key)
    try:
        with CalcxClient(first.url, server_key) as client:
            created = client.create_rollouts(
                [
                    {"rollout_id": "with", "row": ROW, "sampling": {"temperature": 1, "top_k": 40}},
                    {"rollout_id": "without", "row": ROW},
                ]
            )
            assert created[0].sampling == {"temperature": 1.0, "top_k": 40}
            assert created[1].sampling is None
            # the same body again is the same rollout; other sampling is another body
            again = client.create_rollout(
                {"rollout_id": "with", "row": ROW, "sampling": {"top_k": 40, "temperature": 1.0}}
            )
            assert again.created_at == created[0].created_at
            with pytest.raises(CalcxAPIError) as clash:
                client.create_rollout({"rollout_id": "with", "row": ROW, "sampling": {"temperature": 0.5, "top_k": 40}})
            assert clash.value.status == 409
            claims = {c.rollout.rollout_id: c for c in client.claim("ctl", 2, timeout_s=2).claims}
            assert claims["with"].rollout.sampling == {"temperature": 1.0, "top_k": 40}
    finally:
        first.stop()
    second = start_server_thread(db_path, server_key)
    try:
        with CalcxClient(second.url, server_key) as client:
            assert client.get_rollout("with").sampling == {"temperature": 1.0, "top_k": 40}
            assert client.get_rollout("without").sampling is None
            listed = {r.rollout_id: r.sampling for r in client.list_rollouts()}
            assert listed == {"with": {"temperature": 1.0, "top_k": 40}, "without": None}
    finally:
        second.stop()


def test_a_store_written_before_sampling_existed_still_works(tmp_path: Path, server_key: str, upstream: Any) -> None:
    """The store keeps each create body as JSON in `rollouts.spec`; an older server wrote it
    without a `sampling` key. Such a file opens, its rollouts read as having no sampling, the
    identical body sent again is still the same rollout, and their calls pass through."""
    path = str(tmp_path / "old.db")
    old_spec = (
        '{"deadline_s":300.0,"env_map":null,"group_id":null,"labels":{"k":"v"},"max_attempts":3,'
        '"policy_version":null,"rollout_id":"old-1","row":{"question":"What is 2 + 2 ?","result":"4"}}'
    )
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.execute(
        "INSERT INTO rollouts (rollout_id, group_id, spec, state, latest_attempt, created_at) "
        "VALUES ('old-1', NULL, ?, 'QUEUED', 1, 1000.0)",
        (old_spec,),
    )
    db.execute("INSERT INTO attempts (rollout_id, attempt_no, state, created_at) VALUES ('old-1', 1, 'QUEUED', 1000.0)")
    db.commit()
    db.close()

    server = start_server_thread(path, server_key)
    try:
        with CalcxClient(server.url, server_key) as client:
            old = client.get_rollout("old-1")
            assert old.sampling is None and old.labels == {"k": "v"} and old.created_at == 1000.0
            again = client.create_rollout({"rollout_id": "old-1", "row": ROW, "labels": {"k": "v"}})
            assert again.created_at == 1000.0  # idempotent, not a 409
            client.put_models("m", [upstream.url])
            claim = client.claim("ctl", 1, timeout_s=2).claims[0]
            client.chat_completions("old-1", claim.attempt_id, {"model": "x", "messages": MESSAGES, **AGENT})
            sent = upstream.requests[-1]
            assert {k: sent.get(k) for k in AGENT} == AGENT and "top_k" not in sent and "seed" not in sent
    finally:
        server.stop()


def test_gateway_applies_the_rollouts_sampling_over_the_agents(
    client: CalcxClient, upstream: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client.put_models("policy", [upstream.url])
    client.create_rollouts(
        [
            {"rollout_id": "trained", "row": ROW, "sampling": TRAINER},
            {"rollout_id": "plain", "row": ROW},
        ]
    )
    claims = {c.rollout.rollout_id: c for c in client.claim("ctl", 2, timeout_s=2).claims}
    caplog.set_level(logging.DEBUG, logger="calcx.server.gateway")

    client.chat_completions("trained", claims["trained"].attempt_id, {"model": "x", "messages": MESSAGES, **AGENT})
    sent = upstream.requests[-1]
    assert {k: sent.get(k) for k in TRAINER} == TRAINER  # the trainer's values, not the agent's
    assert sent["max_tokens"] == 10  # not sampling: the agent's, clamped
    assert "presence_penalty" not in sent  # a sampling parameter the rollout leaves out is not the agent's either
    assert sent["messages"] == MESSAGES and sent["model"] == "policy" and sent["logprobs"] is True
    # a call without any sampling fields gets the rollout's too
    client.chat_completions("trained", claims["trained"].attempt_id, {"model": "x", "messages": MESSAGES})
    assert {k: upstream.requests[-1].get(k) for k in TRAINER} == TRAINER
    # the recorded request is the one forwarded
    recorded = client.calls("trained")
    assert [c.request for c in recorded] == upstream.requests[-2:]

    client.chat_completions("plain", claims["plain"].attempt_id, {"model": "x", "messages": MESSAGES, **AGENT})
    sent = upstream.requests[-1]
    assert {k: sent.get(k) for k in AGENT} == AGENT  # as the agent sent it
    assert "top_k" not in sent and "seed" not in sent
    assert client.calls("plain")[0].request == sent

    overrides = [r for r in caplog.records if r.name == "calcx.server.gateway" and "replaced" in r.getMessage()]
    assert len(overrides) == 1 and overrides[0].levelno == logging.DEBUG, [r.getMessage() for r in overrides]
    assert "'temperature': 1.3" in overrides[0].getMessage() and "trained" in overrides[0].getMessage()
