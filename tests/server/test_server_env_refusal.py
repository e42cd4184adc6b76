"""POST /v1/rollouts refuses a row that no runner could hand to an agent (calcx.contract.env's
rule), or whose env_map sets a reserved variable, with a 422 naming the rollout, the field or key
and the reason; the batch creates nothing."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.contract.env import (
    AGL_KEY,
    AGL_OPENAI_BASE_URL,
    CALCX_CALCULATOR_CMD,
    CALCX_KEY,
    CALCX_ROLLOUT_ID,
    MAX_ENV_BYTES,
)
from calcx.server.serve import ServerThread

#: An env_map that maps every variable an agent needs from its row.
MAPPED = {"QUESTION": "question", "RESULT": "result"}


def row(question: Any = "What is 1 + 1?", **extra: Any) -> dict[str, Any]:
    return {"id": "q", "question": question, "chain": "", "result": "2", "source": "t", **extra}


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ({"row": row("2+3\x00")}, "'question' (as QUESTION)", "NUL character"),
        ({"row": row("x" * MAX_ENV_BYTES)}, "'question' (as QUESTION)", "Linux limits one variable"),
        (
            {"row": row(notes={"a": "\ud800"}), "env_map": {**MAPPED, "NOTES": "notes"}},
            "'notes' (as NOTES)",
            "not valid Unicode",
        ),
        (
            {"row": row(), "env_map": {**MAPPED, "MY VAR": "result"}},
            "'result' (as MY VAR)",
            "not a valid C identifier-like name",
        ),
    ],
)
def test_row_no_runner_can_carry_is_refused_at_creation(
    server: ServerThread, server_key: str, client: CalcxClient, spec: dict[str, Any], field: str, reason: str
) -> None:
    body = {"rollouts": [{"rollout_id": "fine", "row": row()}, {"rollout_id": "bad", **spec}]}
    # sent as ASCII JSON: a lone surrogate has no UTF-8 form, but JSON can escape it
    answer = httpx.post(
        f"{server.url}/v1/rollouts",
        content=json.dumps(body),
        headers={"Authorization": f"Bearer {server_key}", "Content-Type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_body"
    message = error["message"]
    assert "rollouts.1" in message and "rollout 'bad'" in message, message
    assert f"row field {field}" in message and reason in message, message
    with pytest.raises(CalcxAPIError) as missing:  # the whole batch was refused
        client.get_rollout("fine")
    assert missing.value.status == 404


def test_hostile_text_a_runner_can_carry_is_accepted(client: CalcxClient) -> None:
    text = 'key: "v"\n--- {{ 7*7 }} $(id) \u2028 😀 \t\r\n' + "x" * 100_000
    created = client.create_rollout({"rollout_id": "hostile", "row": row(text)})
    assert created.state == "QUEUED"
    claim = client.claim("c", 1, timeout_s=1).claims[0]
    assert claim.env["QUESTION"] == text


@pytest.mark.parametrize(
    "key",
    [
        CALCX_CALCULATOR_CMD,
        CALCX_KEY,
        CALCX_ROLLOUT_ID,
        "CALCX_ANYTHING_NEW",
        AGL_KEY,
        AGL_OPENAI_BASE_URL,
        "PATH",
        "PYTHONPATH",
        "PEX_ROOT",
        "LD_PRELOAD",
    ],
)
def test_env_map_may_not_set_a_reserved_variable(client: CalcxClient, key: str) -> None:
    """A row picks data for its agent, never the calculator command, the attempt token, the
    gateway or what the agent process loads: such an env_map key is refused by name (422)."""
    spec = {"rollout_id": "bad", "row": row(cmd='["sh", "-c", "id"]'), "env_map": {**MAPPED, key: "cmd"}}
    with pytest.raises(CalcxAPIError) as refused:
        client.create_rollouts([{"rollout_id": "fine", "row": row()}, spec])
    assert (refused.value.status, refused.value.code) == (422, "invalid_body")
    assert f"rollout 'bad': env_map key {key!r} is refused" in refused.value.message, refused.value.message
    with pytest.raises(CalcxAPIError) as missing:  # the whole batch was refused
        client.get_rollout("fine")
    assert missing.value.status == 404


def test_env_map_may_set_a_variable_of_the_rows_own(client: CalcxClient) -> None:
    spec = {"rollout_id": "notes", "row": row(notes="n"), "env_map": {**MAPPED, "NOTES": "notes"}}
    assert client.create_rollouts([spec])[0].state == "QUEUED"
    assert client.claim("c", 1, timeout_s=1).claims[0].env["NOTES"] == "n"


@pytest.mark.parametrize(("env_map", "unmapped"), [({}, "QUESTION, RESULT"), ({"QUESTION": "question"}, "RESULT")])
def test_env_map_that_maps_no_question_or_result_is_refused(
    client: CalcxClient, env_map: dict[str, str], unmapped: str
) -> None:
    """An env_map replaces the default map (an empty one too), so one that leaves out what the
    agent needs from its row is refused by name (422), not found by the agent at every attempt."""
    with pytest.raises(CalcxAPIError) as refused:
        client.create_rollouts(
            [{"rollout_id": "fine", "row": row()}, {"rollout_id": "bad", "row": row(), "env_map": env_map}]
        )
    assert (refused.value.status, refused.value.code) == (422, "invalid_body")
    assert f"rollout 'bad': env_map maps no row field to {unmapped}" in refused.value.message, refused.value.message
    with pytest.raises(CalcxAPIError) as missing:  # the whole batch was refused
        client.get_rollout("fine")
    assert missing.value.status == 404
