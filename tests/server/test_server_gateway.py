"""The gateway against a real fake-vLLM upstream: recording, token ids, retries, stickiness,
the max_tokens ceiling and the answers an OpenAI client sees."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall, ChatCompletionUserMessageParam

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.api.models import Claim
from calcx.contract.failures import FailureReason
from calcx.server.serve import bind_socket, start_server_thread

QUESTION = "What is 2 + 2 ?"
MESSAGES: list[ChatCompletionUserMessageParam] = [{"role": "user", "content": QUESTION}]


def running_claims(client: CalcxClient, n: int = 1, prefix: str = "g") -> list[Claim]:
    client.create_rollouts([{"rollout_id": f"{prefix}-{i}", "row": {"question": "q", "result": "4"}} for i in range(n)])
    claims = client.claim("ctl", n, timeout_s=2).claims
    assert len(claims) == n
    return claims


def test_openai_client_through_gateway_records_tokens(client: CalcxClient, upstream: Any) -> None:
    client.put_models("policy-7b", [upstream.url], policy_version=3)
    claim = running_claims(client)[0]
    oa = openai.OpenAI(base_url=claim.env["AGL_OPENAI_BASE_URL"], api_key=claim.env["AGL_KEY"], max_retries=0)
    first = oa.chat.completions.create(model="whatever", messages=MESSAGES, max_tokens=100000)
    assert first.choices[0].message.content == "### ANSWER: 42 ###"
    second = oa.chat.completions.create(model="whatever", messages=MESSAGES + MESSAGES)
    assert second.id != first.id

    sent = upstream.requests[-2]
    assert sent["model"] == "policy-7b"  # the registered model, whatever the agent asked for
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["stream"] is False
    assert sent["max_tokens"] == 4096  # clamped to the ceiling
    assert upstream.requests[-1]["max_tokens"] == 4096  # absent -> the ceiling

    calls = client.calls(claim.rollout.rollout_id)
    assert [c.seq for c in calls] == [0, 1] and all(c.attempt_id == "1" for c in calls)
    call = calls[0]
    words = len(QUESTION.split())
    assert call.prompt_token_ids == list(range(100, 100 + words))
    assert call.response_token_ids == [7, 8, 9]
    assert call.response_logprobs == pytest.approx([-0.7, -0.8, -0.9])
    assert call.status_code == 200 and call.policy_version == 3 and call.endpoint == upstream.url
    assert call.latency_s > 0 and call.request["messages"] == MESSAGES
    assert call.response is not None and call.response["id"] == first.id
    assert len(calls[1].prompt_token_ids) == 2 * words
    assert client.calls(claim.rollout.rollout_id, attempt_id="2") == []


def test_calls_carry_the_policy_version_served_at_the_time_of_the_call(client: CalcxClient, upstream: Any) -> None:
    """The version a rollout declares (the step it was made for) is not what answered it: each call
    records the registry's version when it was made, which the trainer moves after a weight sync."""
    client.put_models("m", [upstream.url], policy_version=6)
    client.create_rollouts(
        [
            {"rollout_id": "step-7", "row": {"question": "q", "result": "4"}, "policy_version": 7},
            {"rollout_id": "no-step", "row": {"question": "q", "result": "4"}},
        ]
    )
    claims = {c.rollout.rollout_id: c for c in client.claim("ctl", 2, timeout_s=2).claims}
    for rid in ("step-7", "no-step"):
        client.chat_completions(rid, claims[rid].attempt_id, {"model": "m", "messages": MESSAGES})
    client.put_models("m", [upstream.url], policy_version=7)  # a weight sync between two turns
    client.chat_completions("step-7", claims["step-7"].attempt_id, {"model": "m", "messages": MESSAGES + MESSAGES})
    assert [c.policy_version for c in client.calls("step-7")] == [6, 7]
    assert [c.policy_version for c in client.calls("no-step")] == [6]
    assert client.get_rollout("step-7").policy_version == 7  # the declared step is kept on the rollout


def test_upstream_5xx_is_retried_then_recorded_once(client: CalcxClient, upstream: Any) -> None:
    client.put_models("m", [upstream.url])
    claim = running_claims(client)[0]
    upstream.fail_next = 2
    before = len(upstream.requests)
    answer = client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    assert answer["choices"][0]["token_ids"] == [7, 8, 9]  # vLLM extras are passed through
    assert len(upstream.requests) - before == 3
    calls = client.calls(claim.rollout.rollout_id)
    assert len(calls) == 1 and calls[0].status_code == 200 and calls[0].response_token_ids == [7, 8, 9]
    metrics = client.metrics_text()
    assert 'calcx_gateway_upstream_errors_total{kind="500"} 2.0' in metrics


def test_an_aborted_call_is_sent_again_and_recorded_with_the_version_that_answered(
    client: CalcxClient, upstream: Any
) -> None:
    """vLLM ends the calls in flight with finish reason "abort" when the trainer pauses generation
    for a weight update: the agent waits and gets the model's answer, made by the new weights."""
    client.put_models("m", [upstream.url], policy_version=4)
    claim = running_claims(client)[0]
    upstream.abort_next = 2
    # as in verl: the resent call waits in the paused server while the trainer updates the weights
    # and publishes their version, then the new weights answer it
    upstream.before_answer = lambda: client.put_models("m", [upstream.url], policy_version=5)
    before = len(upstream.requests)
    answer = client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["choices"][0]["token_ids"] == [7, 8, 9]
    assert len(upstream.requests) - before == 3
    assert upstream.requests[-1] == upstream.requests[-3]  # the same request, sent again
    calls = client.calls(claim.rollout.rollout_id)
    assert len(calls) == 1  # the aborted answers are not the model's and are not recorded
    assert calls[0].response_token_ids == [7, 8, 9] and calls[0].policy_version == 5
    assert 'calcx_gateway_upstream_errors_total{kind="abort"} 2.0' in client.metrics_text()


def test_a_call_answered_at_once_keeps_the_version_it_was_sent_at(client: CalcxClient, upstream: Any) -> None:
    """Without an abort the answer was begun by the weights registered when it was sent."""
    client.put_models("m", [upstream.url], policy_version=4)
    claim = running_claims(client)[0]
    upstream.before_answer = lambda: client.put_models("m", [upstream.url], policy_version=5)
    client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    assert client.calls(claim.rollout.rollout_id)[0].policy_version == 4


def test_an_aborted_call_goes_to_an_endpoint_registered_while_it_waited(
    client: CalcxClient, make_upstream: Any
) -> None:
    paused, serving = make_upstream(), make_upstream()
    client.put_models("m", [paused.url], policy_version=1)
    claim = running_claims(client)[0]
    paused.abort_next = 1
    paused.on_abort = lambda: client.put_models("m-served", [serving.url], policy_version=2)
    client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    call = client.calls(claim.rollout.rollout_id)[0]
    assert (call.endpoint, call.policy_version, call.response_token_ids) == (serving.url, 2, [7, 8, 9])
    assert len(paused.requests) == 1 and len(serving.requests) == 1
    assert serving.requests[0]["model"] == "m-served" and call.request["model"] == "m-served"


def test_a_call_aborted_past_abort_retry_s_fails_the_attempt_as_infrastructure(
    db_path: str, server_key: str, upstream: Any
) -> None:
    """An aborted answer is empty: handed to the agent it would score 0 and train as a wrong
    answer. Past abort_retry_s the attempt fails (model_aborted, retried) and the agent gets a 503."""
    server = start_server_thread(db_path, server_key, abort_retry_s=2.0, upstream_backoff_s=0.01)
    try:
        with CalcxClient(server.url, server_key, timeout=10.0) as client:
            client.put_models("m", [upstream.url], policy_version=1)
            claim = running_claims(client)[0]
            rid, aid = claim.rollout.rollout_id, claim.attempt_id
            upstream.abort_next = 1000
            started = time.monotonic()
            with pytest.raises(CalcxAPIError) as err:
                client.chat_completions(rid, aid, {"model": "m", "messages": MESSAGES})
            waited = time.monotonic() - started
            assert err.value.status == 503 and err.value.code == FailureReason.MODEL_ABORTED
            resent = len(upstream.requests) - 1
            assert resent >= 1 and f'calcx_gateway_upstream_errors_total{{kind="abort"}} {resent + 1}.0' in (
                client.metrics_text()
            )  # sent again, each abort counted, then given up on
            assert waited < 60  # bounded by abort_retry_s (2 s + one try and backoff); 30x margin
            calls = client.calls(rid)
            assert len(calls) == 1 and calls[0].status_code == 503 and calls[0].response_token_ids == []
            rollout = client.get_rollout(rid)
            assert rollout.state == "FAILED" and rollout.attempts[-1].reason == FailureReason.MODEL_ABORTED
            with pytest.raises(CalcxAPIError) as late:  # a reward after the failure cannot score it
                client.post_event(rid, aid, "reward", {"value": 0.0})
            assert late.value.status == 409
            assert client.retry(rid).state == "QUEUED"  # infrastructure: retried, not trained
    finally:
        server.stop()


def test_abort_retry_s_zero_fails_the_attempt_at_once(db_path: str, server_key: str, upstream: Any) -> None:
    server = start_server_thread(db_path, server_key, abort_retry_s=0.0)
    try:
        with CalcxClient(server.url, server_key, timeout=10.0) as client:
            client.put_models("m", [upstream.url])
            claim = running_claims(client)[0]
            upstream.abort_next = 1
            with pytest.raises(CalcxAPIError) as err:
                client.chat_completions(
                    claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES}
                )
            assert err.value.code == FailureReason.MODEL_ABORTED and len(upstream.requests) == 1
            assert client.get_rollout(claim.rollout.rollout_id).state == "FAILED"
    finally:
        server.stop()


def test_upstream_down_gives_502_after_bounded_retries(client: CalcxClient, upstream: Any) -> None:
    client.put_models("m", [upstream.url])
    claim = running_claims(client)[0]
    upstream.fail_next = 100
    upstream.fail_status = 503
    before = len(upstream.requests)
    started = time.monotonic()
    with pytest.raises(CalcxAPIError) as err:
        client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    assert len(upstream.requests) - before == 4  # the first try and the 3 retries, then it gives up
    # bounded: ~0.1 s here; the ceiling only catches a gateway that keeps trying (30x margin)
    assert time.monotonic() - started < 30
    assert err.value.status == 502 and err.value.code == "upstream_unavailable"
    assert "4 tries" in err.value.message and "503" in err.value.message
    upstream.fail_next = 0
    calls = client.calls(claim.rollout.rollout_id)
    assert len(calls) == 1 and calls[0].status_code == 502 and calls[0].response_token_ids == []


def test_unreachable_endpoint_fails_over_to_the_next(client: CalcxClient, upstream: Any) -> None:
    dead_sock = bind_socket()
    dead = f"http://127.0.0.1:{dead_sock.getsockname()[1]}/v1"
    dead_sock.close()  # nothing listens there now: connection refused
    client.put_models("m", [dead, upstream.url])
    claims = running_claims(client, 6)
    for claim in claims:
        client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    recorded = [client.calls(c.rollout.rollout_id)[0] for c in claims]
    assert all(c.status_code == 200 and c.endpoint == upstream.url for c in recorded)
    assert 'calcx_gateway_upstream_errors_total{kind="connect"}' in client.metrics_text()


def test_upstream_4xx_goes_back_unchanged_and_is_recorded(client: CalcxClient, upstream: Any) -> None:
    client.put_models("reject-me", [upstream.url])
    claim = running_claims(client)[0]
    before = len(upstream.requests)
    with pytest.raises(CalcxAPIError) as err:
        client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    assert err.value.status == 400 and len(upstream.requests) - before == 1
    calls = client.calls(claim.rollout.rollout_id)
    assert calls[0].status_code == 400 and calls[0].response == {"error": {"message": "bad request upstream"}}


def test_a_refusal_for_the_models_context_goes_back_with_openais_code(client: CalcxClient, upstream: Any) -> None:
    """vLLM words a conversation past the model's context in a 400's message only; the agent gets
    OpenAI's `context_length_exceeded` beside it (its run then ends unanswered, not failed), once,
    and the call is recorded as it went back."""
    from calcx.stub_llm.app import OVERLONG_ERROR

    client.put_models("m", [upstream.url])
    claim = running_claims(client)[0]
    upstream.fail_next, upstream.fail_status, upstream.fail_error = 1, 400, OVERLONG_ERROR
    before = len(upstream.requests)
    with pytest.raises(CalcxAPIError) as err:
        client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    assert err.value.status == 400 and err.value.code == "context_length_exceeded"
    assert len(upstream.requests) - before == 1  # a 400 is not retried
    recorded = client.calls(claim.rollout.rollout_id)[0]
    assert recorded.status_code == 400
    assert recorded.response == {"error": {**OVERLONG_ERROR, "code": "context_length_exceeded"}}


def test_token_ids_past_int32_are_left_out_and_the_call_kept(client: CalcxClient, upstream: Any) -> None:
    """Token ids the store cannot pack as int32: the call is recorded without token ids and
    log-probs, with everything else, and the agent gets the answer as it came."""
    client.put_models("m", [upstream.url], policy_version=4)
    claim = running_claims(client)[0]
    upstream.answer_ids = [7, 2**40, 9]
    answer = client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    assert answer["choices"][0]["token_ids"] == [7, 2**40, 9]
    calls = client.calls(claim.rollout.rollout_id)
    assert len(calls) == 1
    call = calls[0]
    assert call.status_code == 200 and call.policy_version == 4 and call.endpoint == upstream.url
    assert call.prompt_token_ids == [] and call.response_token_ids == [] and call.response_logprobs == []
    assert call.request["messages"] == MESSAGES and call.response is not None
    assert call.response["choices"][0]["token_ids"] == [7, 2**40, 9]


def test_gateway_refuses_attempts_that_are_not_running(client: CalcxClient, upstream: Any) -> None:
    client.put_models("m", [upstream.url])
    claim = running_claims(client)[0]
    client.finish(claim.rollout.rollout_id, claim.attempt_id, "SUCCEEDED")
    with pytest.raises(CalcxAPIError) as err:
        client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    assert err.value.status == 409 and "SUCCEEDED" in err.value.message


def test_endpoint_choice_is_sticky_per_rollout(client: CalcxClient, make_upstream: Any) -> None:
    """Two upstreams; every call of one rollout goes to the same one, and both get used."""
    fakes = [make_upstream(), make_upstream()]
    client.put_models("m", [f.url for f in fakes])
    claims = running_claims(client, 8, prefix="sticky")
    for _ in range(3):
        for claim in claims:
            client.chat_completions(claim.rollout.rollout_id, claim.attempt_id, {"model": "m", "messages": MESSAGES})
    per_rollout = {c.rollout.rollout_id: {x.endpoint for x in client.calls(c.rollout.rollout_id)} for c in claims}
    assert all(len(endpoints) == 1 for endpoints in per_rollout.values())
    assert set().union(*per_rollout.values()) == {f.url for f in fakes}


def test_a_replica_that_fails_gets_no_new_rollout_and_a_busy_one_still_does(
    db_path: str, server_key: str, make_upstream: Any
) -> None:
    """A 429 is a busy replica (it stays in the choice); a 500 takes it out until it answers (the
    probe waits 300 s here, so it stays out)."""
    a, b = make_upstream(), make_upstream()
    server = start_server_thread(db_path, server_key, upstream_backoff_s=0.01, replica_probe_s=300.0)
    try:
        with CalcxClient(server.url, server_key, timeout=10.0) as client:
            client.put_models("m", [a.url, b.url])
            claims = {c.rollout.rollout_id: c.attempt_id for c in running_claims(client, 4, prefix="r")}

            def call(rid: str) -> list[str | None]:
                client.chat_completions(
                    rid,
                    claims[rid],
                    {"model": "m", "messages": MESSAGES + [{"role": "user", "content": str(len(client.calls(rid)))}]},
                )
                return [c.endpoint for c in client.calls(rid)]

            a.fail_next, a.fail_status = 1, 429
            assert call("r-0") == [b.url]  # A was busy; B answered, and r-0 lives there now
            up = 'calcx_gateway_replica_up{endpoint="%s"} %s'
            assert up % (a.url, "1.0") in client.metrics_text()
            a.fail_next, a.fail_status = 1, 500
            assert call("r-1") == [b.url]  # A, with no rollout, got r-1 and failed it
            metrics = client.metrics_text()
            assert up % (a.url, "0.0") in metrics and up % (b.url, "1.0") in metrics
            assert call("r-2") == [b.url]  # nothing new for A while it is down
            assert len(a.requests) == 2 and call("r-1") == [b.url, b.url]
    finally:
        server.stop()


def test_a_call_the_agent_sent_again_is_recorded_once_with_the_answer_it_used(
    client: CalcxClient, upstream: Any
) -> None:
    """The agent's client times out on a slow answer and sends the call again: the late answer to
    the first send reaches nobody. One record, the answer the agent got; never two trained turns."""
    client.put_models("m", [upstream.url], policy_version=1)
    claim = running_claims(client)[0]
    first_answered = threading.Event()
    slow = [True]

    def slow_first_answer() -> None:
        if slow.pop() if slow else False:
            time.sleep(2.5)
            first_answered.set()

    upstream.before_answer = slow_first_answer
    oa = openai.OpenAI(
        base_url=claim.env["AGL_OPENAI_BASE_URL"], api_key=claim.env["AGL_KEY"], max_retries=1, timeout=1.0
    )
    used = oa.chat.completions.create(model="m", messages=MESSAGES)
    assert first_answered.wait(10)
    time.sleep(0.5)  # the late answer's turn to be recorded
    assert len(upstream.requests) == 2 and upstream.requests[0] == upstream.requests[1]
    calls = client.calls(claim.rollout.rollout_id)
    assert len(calls) == 1, [(c.seq, c.status_code) for c in calls]
    assert calls[0].status_code == 200 and calls[0].response is not None and calls[0].response["id"] == used.id
    assert calls[0].latency_s < 2.0  # the resend's quick answer, not the 2.5 s one nobody read


def _tool_turn_forwarded(client: CalcxClient, upstream: Any, content: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """(the messages sent, those forwarded upstream, those recorded) for a conversation whose earlier
    model turn has `content` and a tool call."""
    client.put_models("policy", [upstream.url], policy_version=1)
    claim = running_claims(client, prefix=f"tool-turn-{len(upstream.requests)}")[0]
    call = {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "10/2"}'}}
    messages: list[Any] = [
        {"role": "user", "content": "Liza has 10 kg and uses half. How much is left?"},
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "5.0\n"},
        {"role": "assistant", "content": "5 kg.\n"},  # no calls: always as it is
        {"role": "user", "content": "And then?"},
    ]
    oa = openai.OpenAI(base_url=claim.env["AGL_OPENAI_BASE_URL"], api_key=claim.env["AGL_KEY"], max_retries=0)
    oa.chat.completions.create(model="m", messages=messages)
    recorded = client.calls(claim.rollout.rollout_id)[0].request["messages"]
    return messages, upstream.requests[-1]["messages"], recorded


def test_with_the_hermes_parser_an_earlier_tool_turn_goes_back_as_the_model_wrote_it(
    db_path: str, server_key: str, upstream: Any
) -> None:
    # vLLM's hermes parser leaves the line break before <tool_call> on the text; the chat template
    # puts its own there: one is dropped, so the turn renders as generated (calcx.server.assistant_turns)
    server = start_server_thread(db_path, server_key, upstream_timeout_s=5.0, tool_call_parser="hermes")
    try:
        with CalcxClient(server.url, server_key, timeout=10.0) as client:
            for content, sent_as in (
                ("She used 10/2 =\n", "She used 10/2 ="),
                ("x\n\n", "x\n"),
                ("x", "x"),
                ("", ""),
                (None, None),
            ):
                messages, forwarded, recorded = _tool_turn_forwarded(client, upstream, content)
                assert forwarded[1] == {**messages[1], "content": sent_as}, content
                assert forwarded[0] == messages[0] and forwarded[2:] == messages[2:]
                assert recorded == forwarded  # the recorded request is the one forwarded
    finally:
        server.stop()


TEMPLATE_CALL = (
    'Let me compute.\n<tool_call>\n{{"name": "calculate", "arguments": {"expression": "2 * 6 / 4"}}}\n'
    "</tool_call>\n### ANSWER: 3"
)


def test_with_the_hermes_parser_calls_in_the_templates_doubled_braces_are_made(
    db_path: str, server_key: str, upstream: Any
) -> None:
    """A call written as Qwen2.5's template shows it (`{{"name": ...}}`, which vLLM's parser cannot
    read) reaches the agent as the call it states, and is recorded so; the tokens are the model's."""
    server = start_server_thread(db_path, server_key, upstream_timeout_s=5.0, tool_call_parser="hermes")
    upstream.answer_text = TEMPLATE_CALL
    try:
        with CalcxClient(server.url, server_key, timeout=10.0) as client:
            client.put_models("policy", [upstream.url], policy_version=1)
            claim = running_claims(client, prefix="template-call")[0]
            oa = openai.OpenAI(base_url=claim.env["AGL_OPENAI_BASE_URL"], api_key=claim.env["AGL_KEY"], max_retries=0)
            answer = oa.chat.completions.create(model="m", messages=MESSAGES).choices[0]
            assert answer.finish_reason == "tool_calls" and answer.message.content == "Let me compute.\n"
            made = answer.message.tool_calls or []
            assert [
                (c.function.name, json.loads(c.function.arguments))
                for c in made
                if isinstance(c, ChatCompletionMessageFunctionToolCall)
            ] == [("calculate", {"expression": "2 * 6 / 4"})]
            recorded = client.calls(claim.rollout.rollout_id)[0]
            assert recorded.response is not None
            assert recorded.response["choices"][0]["message"]["tool_calls"][0]["id"] == made[0].id
            assert recorded.response_token_ids == [7, 8, 9]
            metrics = httpx.get(f"{server.url}/metrics").text
            assert "calcx_gateway_stated_calls_read_total 1.0" in metrics
    finally:
        server.stop()


def test_without_a_known_parser_a_templates_call_stays_text(client: CalcxClient, upstream: Any) -> None:
    upstream.answer_text = TEMPLATE_CALL
    client.put_models("policy", [upstream.url], policy_version=1)
    claim = running_claims(client, prefix="template-call-off")[0]
    oa = openai.OpenAI(base_url=claim.env["AGL_OPENAI_BASE_URL"], api_key=claim.env["AGL_KEY"], max_retries=0)
    answer = oa.chat.completions.create(model="m", messages=MESSAGES).choices[0]
    assert answer.message.content == TEMPLATE_CALL and not answer.message.tool_calls


def test_without_a_known_parser_turns_go_as_the_agent_sent_them(client: CalcxClient, upstream: Any) -> None:
    messages, forwarded, recorded = _tool_turn_forwarded(client, upstream, "She used 10/2 =\n")
    assert forwarded == recorded == messages
