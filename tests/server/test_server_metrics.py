"""Prometheus /metrics counts what happened: rollouts by state, claims, events, gateway calls."""

from __future__ import annotations

import re
from typing import Any

import httpx

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.contract.failures import FailureReason


def value(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name + (f"{{{labels}}}" if labels else "")) + r" ([0-9.e+-]+)"
    match = re.search(r"^" + pattern + r"$", text, re.MULTILINE)
    assert match, f"{name}{{{labels}}} not in metrics"
    return float(match.group(1))


def test_metrics_count_the_run(client: CalcxClient, server: Any, upstream: Any) -> None:
    client.put_models("m", [upstream.url])
    client.create_rollouts([{"rollout_id": f"m-{i}", "row": {"question": "q", "result": "1"}} for i in range(4)])
    claims = client.claim("ctl", 3, timeout_s=1).claims
    for c in claims:
        client.chat_completions(
            c.rollout.rollout_id, c.attempt_id, {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        )
        client.post_reward(c.rollout.rollout_id, c.attempt_id, 1.0)
    client.post_event(claims[0].rollout.rollout_id, claims[0].attempt_id, "whatever-custom", {})
    client.finish(claims[0].rollout.rollout_id, claims[0].attempt_id, "SUCCEEDED")
    client.finish(claims[1].rollout.rollout_id, claims[1].attempt_id, "FAILED", reason=FailureReason.CRASH)
    try:
        client.get_rollout("missing")
    except CalcxAPIError:
        pass

    text = httpx.get(f"{server.url}/metrics").text  # open endpoint, no key
    assert value(text, "calcx_rollouts", 'state="QUEUED"') == 1
    assert value(text, "calcx_rollouts", 'state="RUNNING"') == 1
    assert value(text, "calcx_rollouts", 'state="SUCCEEDED"') == 1
    assert value(text, "calcx_rollouts", 'state="FAILED"') == 1
    assert value(text, "calcx_rollouts_created_total") == 4
    assert value(text, "calcx_claims_total") == 3
    assert value(text, "calcx_events_total", 'event_type="reward"') == 3
    assert value(text, "calcx_events_total", 'event_type="other"') == 1
    assert value(text, "calcx_gateway_calls_total", 'status="200"') == 3
    assert value(text, "calcx_gateway_latency_seconds_count") == 3
    assert value(text, "calcx_attempts_finished_total", 'reason="crash",state="FAILED"') == 1
    assert value(text, "calcx_http_errors_total", 'code="not_found",status="404"') == 1
