"""The anchor's verl ToolAgentLoop, fed the model output the calcx agent is fed, sees the same chat
and tool answers and earns the same reward.

Rows: `calcx data generate`, then `calcx data import` (the files a run trains on). The calcx side
is the real agent (`python -m calcx.agent`, AutoGen and its MCP calculator, under the `calcx` PEX's
interpreter) against a scripted OpenAI-compatible endpoint that records every request and the
reward the agent posts. The anchor side is verl 0.9.1's own ToolAgentLoop, built from the anchor's
config and tool config, against a scripted token server with the same turns (in the Hermes text a
Qwen model writes), then verl's own reward manager with the anchor's reward function. Tokens come
from a byte-level tokenizer with the ChatML specials and calcx's Hermes template; on the GPU
it is the model's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from byte_tokenizer import byte_tokenizer
from live_stack import SERVICES_PYTHON, needs_services

from calcx.agent.calculator_inprocess import calculator_tool_entry
from calcx.anchor.config import compose_anchor
from calcx.anchor.data import TOOL_AGENT, anchor_records
from calcx.data.__main__ import main as data_main
from calcx.data.io import read_rows
from calcx.trainer.config.compose import ComposeRequest
from calcx.trainer.run.services import CALCX_SRC


@dataclass
class Script:
    """One rollout's model output: the first turn (text, calculator calls), then, after the calls, the last."""

    first: str
    calls: list[str]
    last: str | None = None


def scripts(rows: list[dict]) -> dict[str, Script]:
    """Correct, wrong and unparseable answers, with and without a calculator round (errors among the
    calls), and an early wrong answer that the last turn corrects."""
    a, b, c, d, e = rows[:5]
    return {
        a["question"]: Script("Let me compute.", ["7 * 12 + 5", "1/0", "2 +"], f"So ### ANSWER: {a['result']} ###"),
        b["question"]: Script("", ["10 / 4"], "### ANSWER: 123456789 ###"),
        c["question"]: Script("Checking.", ["x + 1"], "I cannot tell."),
        d["question"]: Script(f"Easy. ### ANSWER: {d['result']} ###", []),
        e["question"]: Script(
            "### ANSWER: 123456789 ### but let me check", ["3 > 2"], f"Corrected: ### ANSWER: {e['result']} ###"
        ),
    }


# -- the calcx side: the real agent against a recording OpenAI-compatible endpoint --------------------
class Endpoint(ThreadingHTTPServer):
    def __init__(self, plan: dict[str, Script]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.plan = plan
        self.requests: dict[str, list[dict[str, Any]]] = {}  # question: the agent's chat requests
        self.rewards: dict[str, float] = {}  # rollout index: the reward the agent posted
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Endpoint

    def log_message(self, *_: Any) -> None:
        pass

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path.startswith("/event/"):
            with self.server.lock:
                self.server.rewards[self.path.split("/")[-1]] = body["data"]["value"]
            return self._reply({"event_id": "1"})
        opening = next(m["content"] for m in body["messages"] if m["role"] == "user")
        question, script = next((q, s) for q, s in self.server.plan.items() if opening.startswith(q.strip()))
        with self.server.lock:
            self.server.requests.setdefault(question, []).append(body)
        results = [m for m in body["messages"] if m["role"] == "tool"]
        if results or not script.calls:
            message: dict[str, Any] = {"role": "assistant", "content": script.last if results else script.first}
            reason = "stop"
        else:
            message = {
                "role": "assistant",
                "content": script.first or None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "calculate", "arguments": json.dumps({"expression": expr})},
                    }
                    for i, expr in enumerate(script.calls)
                ],
            }
            reason = "tool_calls"
        self._reply(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "message": message, "finish_reason": reason}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def run_agents(rows: list[dict], endpoint: Endpoint) -> None:
    procs = []
    for index, row in enumerate(rows):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_", "CALCX_"))}
        env.update(
            PYTHONPATH=str(CALCX_SRC),
            QUESTION=row["question"],
            RESULT=row["result"],
            AGL_OPENAI_BASE_URL=f"{endpoint.url}/v1",
            AGL_EVENT_URL=f"{endpoint.url}/event/{index}",
            AGL_KEY="k",
            CALCX_MODEL_MAX_RETRIES="0",
        )
        procs.append(
            subprocess.Popen(
                [SERVICES_PYTHON, "-m", "calcx.agent"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]


# -- the anchor side: verl's ToolAgentLoop and reward manager ------------------------------------------


def hermes_turn(text: str, calls: list[str]) -> str:
    """A turn as a Qwen model writes it: text, then one <tool_call> JSON block per call."""
    blocks = [
        f'<tool_call>\n{json.dumps({"name": "calculate", "arguments": {"expression": e}})}\n</tool_call>' for e in calls
    ]
    return "\n".join(([text] if text else []) + blocks)


class TokenServer:
    """verl's LLM client, scripted: the first or last turn by whether a tool answer is in the context."""

    def __init__(self, tokenizer, plan: dict[str, Script]) -> None:
        self.tokenizer, self.plan = tokenizer, plan
        self.prompts: dict[str, list[str]] = {}  # question: the prompts the loop sent, decoded

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        text = self.tokenizer.decode(prompt_ids)
        question, script = next((q, s) for q, s in self.plan.items() if q.strip() in text)
        self.prompts.setdefault(question, []).append(text)
        turn = script.last if "<tool_response>" in text else hermes_turn(script.first, script.calls)
        ids = self.tokenizer.encode(turn, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids))


async def run_tool_agent_loop(cfg, records: list[dict], plan: dict[str, Script]):
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.tools.tool_registry import load_all_tools
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.utils.dataset.rl_dataset import RLHFDataset

    assert _agent_loop_registry[TOOL_AGENT]["_target_"].endswith(".ToolAgentLoop")
    tokenizer = byte_tokenizer()
    server = TokenServer(tokenizer, plan)
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    tools = load_all_tools(multi_turn.tool_config_path, multi_turn.function_tool_path)
    loop = ToolAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap(tools),
        hf_model_type="qwen2",
    )
    reward_manager = load_reward_manager(cfg, tokenizer)
    outcomes = {}
    for record in records:
        question = next(q for q in plan if record["prompt"][1]["content"].startswith(q.strip()))
        output = await loop.run(
            {"temperature": 1.0}, raw_prompt=record["prompt"], tools_kwargs={}, extra_info=dict(record["extra_info"])
        )
        # the DataProto verl's agent loop worker hands its reward workers (AgentLoopWorker._compute_score)
        prompts, responses = torch.tensor([output.prompt_ids]), torch.tensor([output.response_ids])
        batch = TensorDict(
            {
                "prompts": prompts,
                "responses": responses,
                "attention_mask": torch.ones(1, prompts.shape[1] + responses.shape[1], dtype=torch.int64),
                "input_ids": torch.cat([prompts, responses], dim=1),
            },
            batch_size=1,
        )
        non_tensor = {k: np.array([record[k]], dtype=object) for k in ("data_source", "reward_model", "extra_info")}
        non_tensor.update(
            {
                "__num_turns__": np.array([output.num_turns]),
                "tool_extra_fields": np.array([output.extra_fields], dtype=object),
            }
        )
        scored = await reward_manager.run_single(DataProto(batch=batch, non_tensor_batch=non_tensor))
        outcomes[question] = (output, scored["reward_score"])
    return server, outcomes


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    work = tmp_path_factory.mktemp("rows")
    assert (
        data_main(
            [
                "generate",
                "--out",
                str(work / "gen"),
                "--train-size",
                "40",
                "--test-size",
                "12",
                "--mini-size",
                "4",
                "--sample-size",
                "3",
            ]
        )
        == 0
    )
    assert (
        data_main(
            [
                "import",
                str(work / "gen" / "train.parquet"),
                "--format",
                "calcx",
                "--out",
                str(work / "imported"),
                "--val-size",
                "5",
                "--seed",
                "0",
                "--mini-size",
                "2",
                "--sample-size",
                "2",
            ]
        )
        == 0
    )
    found = read_rows(work / "imported" / "train.parquet")
    picked: dict[str, dict[str, Any]] = {}
    for row in found:  # one row per source, so every template of the generator is in play
        picked.setdefault(row["source"], row)
    return list(picked.values())[:5]


@needs_services
def test_tool_agent_loop_sees_and_scores_what_the_agent_does(rows: list[dict]) -> None:
    assert len(rows) == 5 and len({r["source"] for r in rows}) == 5
    plan = scripts(rows)
    endpoint = Endpoint(plan)
    thread = threading.Thread(target=endpoint.serve_forever, daemon=True)
    thread.start()
    try:
        run_agents(rows, endpoint)
    finally:
        endpoint.shutdown()
    cfg = compose_anchor(ComposeRequest(dotlist=["data.max_prompt_length=2048", "data.max_response_length=1024"]))
    records = anchor_records(rows)
    server, outcomes = asyncio.run(run_tool_agent_loop(cfg, records, plan))

    for index, (row, record) in enumerate(zip(rows, records)):
        question = row["question"]
        script = plan[question]
        agent_calls = endpoint.requests[question]
        output, anchor_reward = outcomes[question]
        # the opening chat: the row's system and user messages, as the agent's first request holds them
        first = agent_calls[0]
        assert [{k: m[k] for k in ("role", "content")} for m in first["messages"]] == record["prompt"]
        assert all(set(m) <= {"role", "content", "name"} for m in first["messages"])
        # the tool entry the agent's model is sent, as the loop renders it into its prompt
        assert [json.dumps(t) for t in first["tools"]] == [json.dumps(calculator_tool_entry())]  # key order too
        opening = server.prompts[question][0]
        assert json.dumps(calculator_tool_entry()["function"]) in opening
        assert record["prompt"][0]["content"] in opening and record["prompt"][1]["content"] in opening
        # the calculator's answers: the tool messages of the agent's second request, in the loop's context
        if script.calls:
            assert len(agent_calls) == 2 and "tools" not in agent_calls[1]  # AutoGen's reflection call: no tools
            answers = [m["content"] for m in agent_calls[1]["messages"] if m["role"] == "tool"]
            assert len(answers) == len(script.calls)
            for answer in answers:
                assert f"<tool_response>\n{answer}\n</tool_response>" in server.prompts[question][1]
            assert output.num_turns == 4  # prompt, first turn, calculator answers, last turn
        else:
            assert len(agent_calls) == 1 and output.num_turns == 2
        # the reward: what the agent posted, by verl's reward manager through the anchor's function
        assert anchor_reward == endpoint.rewards[str(index)], (row, script)
    assert [endpoint.rewards[str(i)] for i in range(5)] == [1.0, 0.0, 0.0, 1.0, 1.0]
