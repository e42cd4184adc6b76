"""The stub LLM over real HTTP: turns, failure modes, vLLM-style extras, validation."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageFunctionToolCall

from calcx.common.serving import ThreadedServer
from calcx.stub_llm.app import create_app
from calcx.stub_llm.script import Script

TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "my_calculator",
            "description": "evaluates arithmetic",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
WORD = "Lea buys 4 packs of 6 eggs and breaks 3. How many eggs are whole?"


@pytest.fixture(scope="module")
def stub() -> Iterator[ThreadedServer]:
    with ThreadedServer(create_app(script=Script({WORD: "4 * 6 - 3"}))) as server:
        yield server


@pytest.fixture(scope="module")
def client(stub) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stub.url, timeout=10) as c:
        yield c


def chat(client: httpx.Client, question: str, *, tools=TOOLS, extra_messages=(), headers=None, **body):
    messages = [{"role": "system", "content": "be careful"}, {"role": "user", "content": question}, *extra_messages]
    payload = {"model": "m", "messages": messages, **body}
    if tools is not None:
        payload["tools"] = tools
    return client.post("/v1/chat/completions", json=payload, headers=headers or {})


def tool_turn(call: dict, result: str) -> list[dict]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result},
    ]


def test_first_turn_calls_the_offered_tool_with_the_question_arithmetic(client):
    response = chat(client, "What is 12 * (3 + 4)?\n\nAnswer as ### ANSWER: x ###")
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "my_calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "12 * (3 + 4)"}


def test_scripted_question_uses_the_script_expression(client):
    response = chat(client, f"{WORD}\n\nSolve it and answer as ### ANSWER: x ###")
    call = response.json()["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"expression": "4 * 6 - 3"}


def test_after_tool_result_answers_in_format_and_reflection_too(client):
    first = chat(client, "What is 6 * 7?").json()["choices"][0]["message"]["tool_calls"][0]
    answer = chat(client, "What is 6 * 7?", extra_messages=tool_turn(first, "42")).json()
    assert answer["choices"][0]["message"]["content"].endswith("### ANSWER: 42 ###")
    assert answer["choices"][0]["finish_reason"] == "stop"
    reflection = chat(client, "What is 6 * 7?", tools=None, extra_messages=tool_turn(first, "42"))
    assert "### ANSWER: 42 ###" in reflection.json()["choices"][0]["message"]["content"]


def test_without_tools_answers_directly(client):
    content = chat(client, "What is 2/3?", tools=None).json()["choices"][0]["message"]["content"]
    assert content.endswith("### ANSWER: 0.666667 ###")


def test_multiple_choice_answer_is_the_option_letter(client):
    question = "What is 3 * 5? Answer Choices: A) 10 B) 12 C) 15 D) 18 E) 20"
    call = chat(client, question).json()["choices"][0]["message"]["tool_calls"][0]
    content = chat(client, question, extra_messages=tool_turn(call, "15")).json()["choices"][0]["message"]["content"]
    assert content.endswith("### ANSWER: C ###")


@pytest.mark.parametrize(
    "marker, check",
    [
        ("[stub:wrong]", lambda c: "### ANSWER:" in c and "### ANSWER: 42 ###" not in c),
        ("[stub:noformat]", lambda c: "###" not in c and "42" in c),
    ],
)
def test_answer_modes(client, marker, check):
    question = f"{marker} What is 6 * 7?"
    call = chat(client, question).json()["choices"][0]["message"]["tool_calls"][0]
    content = chat(client, question, extra_messages=tool_turn(call, "42")).json()["choices"][0]["message"]["content"]
    assert check(content), content


def test_badjson_mode_sends_unparseable_arguments(client):
    call = chat(client, "[stub:badjson] What is 6 * 7?").json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "my_calculator"
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["function"]["arguments"])


def test_steps_mode_calls_one_step_a_round_on_the_last_result(client):
    question = "[stub:steps=3] What is 6 * 7?"
    history: list[dict] = []
    expressions = []
    for result in ("42", "43", "44"):
        call = chat(client, question, extra_messages=history).json()["choices"][0]["message"]["tool_calls"][0]
        expressions.append(json.loads(call["function"]["arguments"])["expression"])
        history += tool_turn(call, result)
    assert expressions == ["6 * 7", "42 + 1", "43 + 1"]
    done = chat(client, question, extra_messages=history).json()["choices"][0]
    assert done["finish_reason"] == "stop" and done["message"]["content"].endswith("### ANSWER: 44 ###")
    # tools withheld (an agent's last call after its rounds): the last result is the answer
    forced = chat(client, question, tool_choice="none", extra_messages=history[:2]).json()["choices"][0]
    assert forced["message"]["content"].endswith("### ANSWER: 42 ###")


def test_unknowntool_mode_calls_a_tool_not_offered(client):
    call = chat(client, "[stub:unknowntool] What is 6 * 7?").json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] not in {t["function"]["name"] for t in TOOLS}


def test_error500_mode(client):
    response = chat(client, "[stub:error500] What is 6 * 7?")
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"


def test_slow_mode_delays_then_answers(client):
    started = time.monotonic()
    response = chat(client, "[stub:slow=0.4] What is 6 * 7?")
    assert response.status_code == 200 and time.monotonic() - started >= 0.4


def test_hang_mode_never_answers_in_time(client):
    with pytest.raises(httpx.ReadTimeout):
        client.post(
            "/v1/chat/completions",
            timeout=0.5,
            json={"model": "m", "messages": [{"role": "user", "content": "[stub:hang=30] What is 1 + 1?"}]},
        )


def test_header_selects_mode_and_marker_wins(client):
    assert chat(client, "What is 6 * 7?", headers={"x-stub-mode": "error500"}).status_code == 500
    marked = chat(client, "[stub:normal] What is 6 * 7?", headers={"x-stub-mode": "error500"})
    assert marked.status_code == 200


def test_server_wide_mode():
    with ThreadedServer(create_app(mode="noformat")) as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "What is 1 + 1?"}]}
        content = httpx.post(f"{server.url}/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert "###" not in content["content"]


def test_vllm_extras_are_deterministic_and_consistent(client):
    body = dict(return_token_ids=True, logprobs=True, top_logprobs=1)
    first = chat(client, "What is 9 - 4?", **body).json()
    second = chat(client, "What is 9 - 4?", **body).json()
    choice = first["choices"][0]
    assert first["prompt_token_ids"] == second["prompt_token_ids"] and len(first["prompt_token_ids"]) > 10
    assert choice["token_ids"] == second["choices"][0]["token_ids"]
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert all(-3.01 < e["logprob"] < 0 and e["top_logprobs"] for e in choice["logprobs"]["content"])
    assert first["usage"] == {
        "prompt_tokens": len(first["prompt_token_ids"]),
        "completion_tokens": len(choice["token_ids"]),
        "total_tokens": len(first["prompt_token_ids"]) + len(choice["token_ids"]),
    }
    other = chat(client, "What is 9 - 5?", **body).json()
    assert other["prompt_token_ids"] != first["prompt_token_ids"]


def test_extras_absent_unless_asked(client):
    data = chat(client, "What is 9 - 4?").json()
    assert "prompt_token_ids" not in data and "token_ids" not in data["choices"][0]
    assert data["choices"][0]["logprobs"] is None and data["usage"]["total_tokens"] > 0


@pytest.mark.parametrize(
    "payload, fragment",
    [
        (b"{not json", "not valid JSON"),
        (json.dumps({"model": "m"}).encode(), "'messages'"),
        (json.dumps({"messages": [{"content": "x"}]}).encode(), "messages[0]"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True}).encode(), "stream"),
        (json.dumps({"messages": [{"role": "user", "content": "[stub:explode] x"}]}).encode(), "valid modes"),
    ],
)
def test_bad_requests_get_400_saying_what_is_wrong(client, payload, fragment):
    response = client.post("/v1/chat/completions", content=payload, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]


def test_models_health_and_stats(client):
    assert client.get("/v1/models").json()["data"][0]["id"] == "calcx-stub"
    assert client.get("/healthz").json()["status"] == "ok"
    counts = client.get("/stub/stats").json()["counts"]
    assert counts.get("normal:tool_call", 0) >= 1


def test_openai_client_reads_the_stub(stub):
    with openai.OpenAI(base_url=f"{stub.url}/v1", api_key="x", max_retries=0) as oa:
        completion = oa.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "What is 5 + 5?"}],
            tools=TOOLS,
            extra_body={"return_token_ids": True},
        )
    call = (completion.choices[0].message.tool_calls or [])[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "my_calculator"
    assert completion.model_extra is not None
    assert completion.model_extra["prompt_token_ids"]
