"""Hostile question text through both runners' paths: the server's claim environment, the
Kubernetes Job template (render, parse, compare) and the local runner's spawned process."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from calcx.api.client import CalcxClient
from calcx.api.models import Claim
from calcx.controller.local_runner import LocalRunner
from calcx.faults.hostile import HOSTILE_QUESTION_SUFFIXES, KEY, UNCARRIABLE_QUESTION_SUFFIXES
from calcx.k8s.render import SECRET_KEY_NAME, JobSettings, RenderError, render_attempt
from calcx.server.serve import start_server_thread

GROUP_TEXT = 'grp: "x"\n--- {{ 7*7 }} $(id)'


def hostile_texts() -> dict[str, str]:
    texts = {name: f"What is 12 * 3?\n\n{suffix}" for name, suffix in HOSTILE_QUESTION_SUFFIXES.items()}
    texts["bare-yaml-document"] = "---\nkind: Secret\nmetadata: {name: evil}\n..."
    texts["only-quotes"] = "\"'\"'`\"\"\"'''"
    return texts


@pytest.fixture()
def claims(tmp_path: Path) -> Iterator[dict[str, Claim]]:
    """One claim per hostile text from a real server (the server builds the agent environment)."""
    srv = start_server_thread(str(tmp_path / "calcx.db"), KEY)
    try:
        texts = hostile_texts()
        with CalcxClient(srv.url, KEY) as client:
            client.create_rollouts(
                [
                    {"rollout_id": f"q-{name}", "group_id": GROUP_TEXT, "row": {"question": text, "result": "36"}}
                    for name, text in texts.items()
                ]
            )
            got = client.claim("test", max=len(texts), timeout_s=0).claims
        yield {c.rollout.rollout_id.removeprefix("q-"): c for c in got}
    finally:
        srv.stop()


def test_server_puts_the_exact_text_into_the_claim_environment(claims: dict[str, Claim]) -> None:
    texts = hostile_texts()
    assert set(claims) == set(texts)
    for name, claim in claims.items():
        assert claim.env["QUESTION"] == texts[name], name
        assert claim.env["RESULT"] == "36"


PLAIN_QUESTION = "What is 12 * 3?"


def without_question(job: dict[str, Any]) -> dict[str, Any]:
    """The Job with the value of its QUESTION env entry blanked out."""
    out = copy.deepcopy(job)
    for container in out["spec"]["template"]["spec"]["containers"]:
        for entry in container.get("env", []):
            if entry.get("name") == "QUESTION":
                entry["value"] = "<QUESTION>"
    return out


def test_k8s_job_carries_the_exact_text_and_keeps_its_structure(claims: dict[str, Claim]) -> None:
    texts = hostile_texts()
    for name, claim in claims.items():
        rendered = render_attempt(
            rollout_id=claim.rollout.rollout_id,
            attempt_id=claim.attempt_id,
            group_id=claim.rollout.group_id,
            env=claim.env,
            token=claim.token,
            deadline_s=claim.deadline_s,
            settings=JobSettings(),
        )
        job = yaml.safe_load(rendered.job_yaml)  # one document: safe_load refuses a second
        plain = render_attempt(
            rollout_id=claim.rollout.rollout_id,
            attempt_id=claim.attempt_id,
            group_id=claim.rollout.group_id,
            env={**claim.env, "QUESTION": PLAIN_QUESTION},
            token=claim.token,
            deadline_s=claim.deadline_s,
            settings=JobSettings(),
        )
        # The hostile text changed nothing in the Job but its own value: no field, label,
        # annotation or env entry added, dropped or altered by it.
        assert without_question(job) == without_question(yaml.safe_load(plain.job_yaml)), name
        container = job["spec"]["template"]["spec"]["containers"]
        assert len(container) == 1
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container[0]["env"]}
        assert env["QUESTION"] == texts[name], name
        assert env["AGL_KEY"] == {"secretKeyRef": {"name": rendered.secret_name, "key": SECRET_KEY_NAME}}
        assert claim.token not in rendered.job_yaml
        assert job["metadata"]["annotations"]["calcx.dev/group-id"] == GROUP_TEXT
        assert job["spec"]["backoffLimit"] == 0


def test_k8s_refuses_text_no_environment_can_carry() -> None:
    for suffix in UNCARRIABLE_QUESTION_SUFFIXES.values():
        with pytest.raises(RenderError, match="NUL"):
            render_attempt(
                rollout_id="r",
                attempt_id="1",
                group_id=None,
                env={"QUESTION": f"q {suffix}", "RESULT": "1"},
                token="t",
                deadline_s=10,
                settings=JobSettings(),
            )


DUMP_ENV = (
    "import json, os, sys; "
    "open(os.path.join(sys.argv[1], os.environ['CALCX_ROLLOUT_ID'] + '.json'), 'w', encoding='utf-8')"
    ".write(json.dumps({k: os.environ.get(k) for k in ('QUESTION', 'RESULT')}))"
)


def test_local_runner_hands_the_exact_text_to_a_spawned_agent(claims: dict[str, Claim], tmp_path: Path) -> None:
    texts = hostile_texts()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    # the dump directory on the command line: the runner passes agents no variable of its own
    # environment outside the allowlist (calcx.contract.env)
    runner = LocalRunner(agent_cmd=[sys.executable, "-S", "-c", DUMP_ENV, str(tmp_path)], prefork=False, env=env)

    async def run_all() -> list[Any]:
        await runner.start()
        try:
            return await asyncio.wait_for(asyncio.gather(*(runner.run(c) for c in claims.values())), 60)
        finally:
            await runner.close()

    results = asyncio.run(run_all())
    assert [r.state for r in results] == ["SUCCEEDED"] * len(claims)
    for name, claim in claims.items():
        got = json.loads((tmp_path / f"{claim.rollout.rollout_id}.json").read_text(encoding="utf-8"))
        assert got == {"QUESTION": texts[name], "RESULT": "36"}, name
