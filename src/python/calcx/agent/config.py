"""The agent's configuration, read from its environment (Agent Lightning v1 contract)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from calcx.agent.calculator import calculator_command
from calcx.agent.failures import BadEnvironment
from calcx.contract.env import (
    AGENT_PROMPT_DEFAULT,
    AGL_EVENT_URL,
    AGL_KEY,
    AGL_OPENAI_BASE_URL,
    CALC_X_REL_TOL,
    CALCX_AGENT_PROMPT,
    CALCX_AGENT_TIMEOUT_S,
    CALCX_AGENT_TOOL_ROUNDS,
    CALCX_CALCULATOR_TIMEOUT_S,
    CALCX_MODEL_MAX_RETRIES,
    QUESTION,
    REQUIRED_VARIABLES,
    RESULT,
    RESULT_REL_TOL,
    TOOL_ROUNDS_DEFAULT,
    parse_agent_prompt,
    parse_rel_tol,
    parse_tool_rounds,
)

MAX_RUN_SECONDS = 300.0
DEFAULT_MODEL_MAX_RETRIES = 6
DEFAULT_CALCULATOR_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class AgentConfig:
    question: str
    result: str
    base_url: str
    event_url: str
    key: str
    run_timeout_s: float = MAX_RUN_SECONDS
    model_max_retries: int = DEFAULT_MODEL_MAX_RETRIES
    calculator_timeout_s: float = DEFAULT_CALCULATOR_TIMEOUT_S
    calculator_command: tuple[str, ...] = ()
    tool_rounds: int = TOOL_ROUNDS_DEFAULT
    prompt: str = AGENT_PROMPT_DEFAULT
    rel_tol: float = CALC_X_REL_TOL

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AgentConfig:
        """Validate ``env``; raise BadEnvironment naming the first bad variable."""
        missing = [name for name in REQUIRED_VARIABLES if not (env.get(name) or "").strip()]
        if missing:
            raise BadEnvironment(
                f"environment variable {missing[0]} is missing or empty "
                f"(the agent needs {', '.join(REQUIRED_VARIABLES)}; missing: {', '.join(missing)})"
            )
        for name in (AGL_OPENAI_BASE_URL, AGL_EVENT_URL):
            value = env[name].strip()
            if not value.startswith(("http://", "https://")):
                raise BadEnvironment(f"environment variable {name} must be an http(s) URL, got {value[:200]!r}")
        try:
            command = tuple(calculator_command(env))
            raw_rounds = (env.get(CALCX_AGENT_TOOL_ROUNDS) or "").strip()
            tool_rounds = parse_tool_rounds(raw_rounds) if raw_rounds else TOOL_ROUNDS_DEFAULT
            raw_prompt = (env.get(CALCX_AGENT_PROMPT) or "").strip()
            prompt = parse_agent_prompt(raw_prompt) if raw_prompt else AGENT_PROMPT_DEFAULT
            raw_tol = (env.get(RESULT_REL_TOL) or "").strip()
            rel_tol = parse_rel_tol(raw_tol) if raw_tol else CALC_X_REL_TOL
        except ValueError as exc:
            raise BadEnvironment(str(exc)) from None
        return cls(
            question=env[QUESTION],
            result=env[RESULT],
            base_url=env[AGL_OPENAI_BASE_URL].strip(),
            event_url=env[AGL_EVENT_URL].strip(),
            key=env[AGL_KEY].strip(),
            run_timeout_s=min(MAX_RUN_SECONDS, _positive_float(env, CALCX_AGENT_TIMEOUT_S, MAX_RUN_SECONDS)),
            model_max_retries=int(
                _positive_float(env, CALCX_MODEL_MAX_RETRIES, DEFAULT_MODEL_MAX_RETRIES, zero_ok=True)
            ),
            calculator_timeout_s=_positive_float(env, CALCX_CALCULATOR_TIMEOUT_S, DEFAULT_CALCULATOR_TIMEOUT_S),
            calculator_command=command,
            tool_rounds=tool_rounds,
            prompt=prompt,
            rel_tol=rel_tol,
        )


def _positive_float(env: Mapping[str, str], name: str, default: float, *, zero_ok: bool = False) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadEnvironment(f"environment variable {name} must be a number, got {raw[:100]!r}") from None
    if not (value >= 0 if zero_ok else value > 0) or value != value or value == float("inf"):
        bound = ">= 0" if zero_ok else "> 0"
        raise BadEnvironment(f"environment variable {name} must be a finite number {bound}, got {raw[:100]!r}")
    return value
