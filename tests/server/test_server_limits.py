"""What one attempt may store (events, recorded calls: count and bytes; 413 past them) and
retention (terminal rollouts older than `retain_s` go, with everything recorded for them)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionUserMessageParam

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.server.serve import start_server_thread

MESSAGES: list[ChatCompletionUserMessageParam] = [{"role": "user", "content": "What is 2 + 2 ?"}]


def _start(tmp_path: Path, key: str, **settings: Any):
    return start_server_thread(str(tmp_path / "limits.db"), key, **settings)


def _running(client: CalcxClient, rid: str) -> tuple[str, str]:
    client.create_rollouts([{"rollout_id": rid, "row": {"question": "q", "result": "4"}}])
    claim = client.claim("ctl", 1, timeout_s=2).claims[0]
    return claim.attempt_id, claim.token


def test_events_past_the_attempts_count_or_bytes_are_413(tmp_path: Path, server_key: str) -> None:
    server = _start(tmp_path, server_key, max_events_per_attempt=5, max_event_bytes_per_attempt=2000)
    try:
        with CalcxClient(server.url, server_key) as client:
            aid, token = _running(client, "flood")
            url = f"{server.url}/v1/rollouts/flood/attempts/{aid}/events"
            with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
                for _ in range(5):
                    assert http.post(url, json={"event_type": "log", "data": {"n": 1}}).status_code == 200
                refused = http.post(url, json={"event_type": "reward", "data": {"value": 1.0}})
                assert refused.status_code == 413
                error = refused.json()["error"]
                assert error["code"] == "attempt_limit" and "at most 5 events" in error["message"]
            rollout = client.get_rollout("flood")
            assert len(rollout.events) == 5 and rollout.reward is None  # nothing past the cap was stored

            aid, token = _running(client, "big")
            url = f"{server.url}/v1/rollouts/big/attempts/{aid}/events"
            with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
                assert http.post(url, json={"event_type": "log", "data": {"x": "a" * 1500}}).status_code == 200
                refused = http.post(url, json={"event_type": "log", "data": {"x": "a" * 600}})
                assert refused.status_code == 413 and "2000 bytes" in refused.json()["error"]["message"]
                assert http.post(url, json={"event_type": "reward", "data": {"value": 1}}).status_code == 200
            assert client.get_rollout("big").reward == 1.0  # within the bytes left, a reward still lands
    finally:
        server.stop()


def test_model_calls_past_the_attempts_count_are_413_and_not_forwarded(
    tmp_path: Path, server_key: str, upstream: Any
) -> None:
    server = _start(tmp_path, server_key, max_calls_per_attempt=2)
    try:
        with CalcxClient(server.url, server_key) as client:
            client.put_models("m", [upstream.url], policy_version=1)
            aid, token = _running(client, "chatty")
            oa = openai.OpenAI(
                base_url=f"{server.url}/v1/rollouts/chatty/attempts/{aid}/v1", api_key=token, max_retries=0
            )
            # three different calls: a request repeated word for word is a resend, recorded once
            calls: list[list[ChatCompletionUserMessageParam]] = [
                [{"role": "user", "content": f"call {i}"}] for i in range(3)
            ]
            for messages in calls[:2]:
                oa.chat.completions.create(model="m", messages=messages)
            sent = len(upstream.requests)
            with pytest.raises(openai.APIStatusError) as refused:
                oa.chat.completions.create(model="m", messages=calls[2])
            assert refused.value.status_code == 413 and "at most 2 calls" in str(refused.value)
            assert len(upstream.requests) == sent and len(client.calls("chatty")) == 2
    finally:
        server.stop()


def test_model_calls_past_the_attempts_bytes_are_413(tmp_path: Path, server_key: str, upstream: Any) -> None:
    server = _start(tmp_path, server_key, max_call_bytes_per_attempt=2500)
    try:
        with CalcxClient(server.url, server_key) as client:
            client.put_models("m", [upstream.url], policy_version=1)
            aid, token = _running(client, "long")
            oa = openai.OpenAI(
                base_url=f"{server.url}/v1/rollouts/long/attempts/{aid}/v1", api_key=token, max_retries=0
            )
            long_prompt: list[ChatCompletionUserMessageParam] = [{"role": "user", "content": "x " * 800}]
            oa.chat.completions.create(model="m", messages=long_prompt)  # recorded: about 2000 of 2500 bytes
            sent = len(upstream.requests)
            # a request larger than the bytes left is refused from its Content-Length, never forwarded
            again: list[ChatCompletionUserMessageParam] = [{"role": "user", "content": "y " * 800}]
            with pytest.raises(openai.APIStatusError, match="2500 bytes") as refused:
                oa.chat.completions.create(model="m", messages=again)
            assert refused.value.status_code == 413 and "(Content-Length)" in str(refused.value)
            assert len(upstream.requests) == sent and len(client.calls("long")) == 1
    finally:
        server.stop()


def test_retention_deletes_old_terminal_rollouts_and_keeps_live_ones(tmp_path: Path, server_key: str) -> None:
    server = _start(tmp_path, server_key, retain_s=0.5, retain_check_s=0.1)
    try:
        with CalcxClient(server.url, server_key) as client:
            aid, _ = _running(client, "old")
            client.post_reward("old", aid, 1.0)
            client.finish("old", aid, "SUCCEEDED")
            client.create_rollouts([{"rollout_id": "queued", "row": {"question": "q", "result": "4"}}])
            time.sleep(0.1)
            assert client.get_rollout("old").reward == 1.0  # not yet past retain_s
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    client.get_rollout("old")
                except CalcxAPIError as exc:
                    assert exc.status == 404
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the terminal rollout outlived retain_s")
            assert client.get_rollout("queued").state == "QUEUED"  # never pruned while not terminal
            assert "calcx_rollouts_pruned_total 1.0" in httpx.get(f"{server.url}/metrics").text
    finally:
        server.stop()
