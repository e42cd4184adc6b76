"""A rollout's calls joined into one sequence, end to end: the real server and gateway, the
local-runner controller, the calcx agent with two rounds of calculator calls (so that its answer
call still carries the tools and continues the tool call's tokens), the stub LLM, and
`CalcxAgentLoop.run` as verl calls it, with `calcx.join_calls` on (the default) and off.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from live_stack import SERVICES_PYTHON, agent_loop, needs_services, start_stub

from calcx.api.client import AsyncCalcxClient
from calcx.trainer.config.compose import ComposeRequest, compose
from calcx.trainer.rollouts.tool_use import ToolUseLedger
from calcx.trainer.run.services import CALCX_SRC, LocalServices, ServicesConfig
from calcx.trainer.run_dir.names import TOOL_USE_FILE
from calcx.trainer.run_dir.server_key import write_key_file

pytestmark = [needs_services, pytest.mark.timeout(300)]
N = 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    from calcx.data.generator import generate_split

    work = tmp_path_factory.mktemp("live-join")
    row = generate_split("train", 1, seed=11)[0]
    services = LocalServices(
        ServicesConfig(
            workdir=work / "services",
            services_python=SERVICES_PYTHON,
            services_pythonpath=[str(CALCX_SRC)],
            agent_python=SERVICES_PYTHON,
            agent_pythonpath=[str(CALCX_SRC)],
            concurrency=4,
            tool_rounds=2,
        )
    )
    stub = None
    try:
        services.start()
        stub, stub_url = start_stub(work, [row])
        yield {"services": services, "stub_url": stub_url, "row": row, "work": work}
    finally:
        if stub is not None:
            stub.stop()
        services.stop()


def _outputs(stack: dict, uid: str, *extra: str) -> list[list[Any]]:
    from omegaconf import OmegaConf

    from calcx.trainer.run.data import verl_records

    services = stack["services"]
    cfg = compose(
        ComposeRequest(
            model="calcx-stub",
            server_url=services.server_url,
            dotlist=[
                f"calcx.key_file={write_key_file(services.key)}",
                f"calcx.report_dir={stack['work'] / uid}",
                "calcx.agent_tool_rounds=2",
                "calcx.wait_timeout_s=5",
                "calcx.group_timeout_s=200",
                f"actor_rollout_ref.rollout.n={N}",
                *extra,
            ],
        )
    )
    OmegaConf.resolve(cfg)
    columns = verl_records([stack["row"]])[0]

    async def run() -> list[list[Any]]:
        client = AsyncCalcxClient(services.server_url, services.key)
        try:
            await client.put_models("calcx-stub", [stack["stub_url"]], 0)
        finally:
            await client.aclose()
        return list(
            await asyncio.gather(
                *(
                    agent_loop(cfg).run(
                        {"temperature": 1.0, "top_p": 1.0}, uid=uid, session_id=i, global_steps=1, index=0, **columns
                    )
                    for i in range(N)
                )
            )
        )

    return asyncio.run(run())


def _shape(ledger: ToolUseLedger) -> tuple[float, float]:
    """(model calls, sequences) a rollout, as the trainer's step metrics report them."""
    metrics = ledger.take("train")
    return metrics["calcx/train/model_calls_per_rollout"], metrics["calcx/train/sequences_per_rollout"]


def test_a_rollouts_calls_become_one_sequence_and_stay_apart_when_asked(stack: dict) -> None:
    ledgers = {uid: ToolUseLedger(stack["work"] / uid / TOOL_USE_FILE) for uid in ("uid-apart", "uid-joined")}
    apart = _outputs(stack, "uid-apart", "calcx.join_calls=false")
    joined = _outputs(stack, "uid-joined")
    assert _shape(ledgers["uid-apart"]) == (2.0, 2.0) and _shape(ledgers["uid-joined"]) == (2.0, 1.0)
    for per_call, one in zip(apart, joined):
        assert len(per_call) == 2 and [o.num_turns for o in per_call] == [2, 4]  # the tool call, the answer
        tool_call, answer = per_call
        [sequence] = one
        assert sequence.num_turns == 4 and sequence.reward_score == answer.reward_score == 1.0
        assert sequence.prompt_ids == tool_call.prompt_ids
        between = answer.prompt_ids[len(tool_call.prompt_ids) + len(tool_call.response_ids) :]
        assert answer.prompt_ids == tool_call.prompt_ids + tool_call.response_ids + between and between
        assert sequence.response_ids == tool_call.response_ids + between + answer.response_ids
        assert sequence.response_mask == (
            [1] * len(tool_call.response_ids) + [0] * len(between) + [1] * len(answer.response_ids)
        )
        assert sequence.response_logprobs == (
            tool_call.response_logprobs + [0.0] * len(between) + answer.response_logprobs
        )
