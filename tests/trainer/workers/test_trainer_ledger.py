"""Each training step tells the server's ledger which rollouts it trained: the batch's distinct
rollout ids, recorded as `trainer.global_steps` when verl's `step()` returns; an unreachable
server or a 5xx is tried again, a refusal (409: trained before) stops the step."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.trainer.workers.ledger import TRIES, batch_rollout_ids, record_after_step, record_step


def test_a_batchs_rollouts_are_its_rows_distinct_ids() -> None:
    rows = [
        {"calcx_rollout_id": "a"},
        {"calcx_rollout_id": "a"},
        {"calcx_rollout_id": "b"},
        {},
        None,
        {"calcx_rollout_id": ""},
        {"calcx_rollout_id": "a"},
    ]
    assert batch_rollout_ids(rows) == ["a", "b"]


def test_the_step_is_recorded_when_verls_step_returns() -> None:
    recorded: list[tuple[int, list[str]]] = []
    trainer = SimpleNamespace(global_steps=7)
    trainer.step = lambda metrics, timing: {"ids": ["r1", "r2"], "metrics": metrics}

    def record(step: int, ids: list[str]) -> int:
        recorded.append((step, ids))
        return len(ids)

    record_after_step(trainer, lambda batch: batch["ids"], record)
    assert trainer.step({"m": 1}, {}) == {"ids": ["r1", "r2"], "metrics": {"m": 1}}
    assert recorded == [(7, ["r1", "r2"])]


def _client(answers: list[httpx.Response], sent: list[dict]) -> CalcxClient:
    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        answer = answers.pop(0)
        if answer.status_code == 0:
            raise httpx.ConnectError("refused", request=request)
        return answer

    return CalcxClient("http://calcx.test", "k", transport=httpx.MockTransport(handler))


def test_an_unreachable_or_failing_server_is_tried_again() -> None:
    sent: list[dict] = []
    answers = [
        httpx.Response(0),
        httpx.Response(503, json={"error": {"code": "x", "message": "busy"}}),
        httpx.Response(200, json={"run": "r", "step": 3, "recorded": 2}),
    ]
    slept: list[float] = []
    assert record_step(_client(answers, sent), "r", 3, ["a", "b"], sleep=slept.append, owner="t-1") == 2
    assert sent == [{"run": "r", "step": 3, "rollout_ids": ["a", "b"], "owner": "t-1"}] * 3 and len(slept) == 2


def test_a_refusal_is_raised_at_once_and_an_outage_after_its_tries() -> None:
    sent: list[dict] = []
    conflict = httpx.Response(409, json={"error": {"code": "conflict", "message": "already trained in step 1"}})
    with pytest.raises(CalcxAPIError, match="already trained"):
        record_step(_client([conflict], sent), "r", 2, ["a"], sleep=lambda s: None)
    assert len(sent) == 1
    sent.clear()
    with pytest.raises(CalcxAPIError):
        record_step(_client([httpx.Response(0)] * TRIES, sent), "r", 2, ["a"], sleep=lambda s: None)
    assert len(sent) == TRIES
