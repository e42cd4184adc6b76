"""The environment a runner hands to an agent (Agent Lightning v1 names, plus calcx's own),
and the rule for which values a process environment can carry.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

# -- from the dataset row, through the rollout's env_map --------------------------------------
QUESTION = "QUESTION"
RESULT = "RESULT"
#: How close an answer must come to RESULT, relative (the agent's default: Calc-X's 1e-2); the
#: hard-arithmetic split asks for the exact answer (calcx.data.hard).
RESULT_REL_TOL = "RESULT_REL_TOL"
#: The row field that carries a row's own tolerance.
REL_TOL_FIELD = "rel_tol"
#: Which row field each variable takes when a rollout names no env_map.
DEFAULT_ENV_MAP: dict[str, str] = {QUESTION: "question", RESULT: "result", RESULT_REL_TOL: REL_TOL_FIELD}
#: What every env_map must map: the row's data no agent runs without.
REQUIRED_ROW_VARIABLES: tuple[str, ...] = (QUESTION, RESULT)
#: Variables whose row field a row may lack (or hold null, as a file mixing rows with and without
#: it does): the variable is then left unset and the agent uses its default. Every other variable
#: of an env_map needs its field.
OPTIONAL_ROW_VARIABLES: frozenset[str] = frozenset({RESULT_REL_TOL})
#: Calc-X's relative tolerance, the agent's default: an answer within 1% of the result counts.
CALC_X_REL_TOL = 1e-2


def parse_rel_tol(value: object, *, what: str = RESULT_REL_TOL) -> float:
    """A relative tolerance (a number, or its text) in [0, 1); ValueError naming ``what`` otherwise.
    The server checks a row's with it when the rollout is created, the data schema a file's, the
    agent its variable and the anchor's reward the row it is handed."""
    try:
        tolerance = float(str(value).strip()) if not isinstance(value, bool) else math.nan
    except ValueError:
        tolerance = math.nan
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"{what} must be a relative tolerance from 0 (exact) up to 1, got {str(value)[:100]!r}")
    return tolerance


def env_value(value: Any) -> str:
    """The text a row field becomes in the agent's environment: strings as they are, numbers,
    booleans and null as Python prints them, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float | bool) or value is None:
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def rollout_env_map(env_map: Mapping[str, str] | None) -> Mapping[str, str]:
    """The map a rollout's row goes through: its own, or DEFAULT_ENV_MAP when it names none (None
    only: an empty map is a map, and maps nothing)."""
    return DEFAULT_ENV_MAP if env_map is None else env_map


def unmapped_variables(env_map: Mapping[str, str]) -> list[str]:
    """The REQUIRED_ROW_VARIABLES that ``env_map`` leaves out (an agent given none of them fails)."""
    return [var for var in REQUIRED_ROW_VARIABLES if var not in env_map]


def missing_row_field(row: Mapping[str, Any], env_map: Mapping[str, str]) -> tuple[str, str] | None:
    """The first (variable, field) of ``env_map`` whose field ``row`` lacks and needs, else None."""
    for var, column in env_map.items():
        if column not in row and var not in OPTIONAL_ROW_VARIABLES:
            return var, column
    return None


def row_env(row: Mapping[str, Any], env_map: Mapping[str, str]) -> dict[str, str]:
    """The variables ``row`` gives its agent through ``env_map`` (an optional one whose field the
    row lacks is left out)."""
    return {
        var: env_value(row[column])
        for var, column in env_map.items()
        if column in row and not (var in OPTIONAL_ROW_VARIABLES and row[column] is None)
    }


# -- from the server, per attempt ---------------------------------------------------------------
AGL_PREFIX = "AGL_"
AGL_OPENAI_BASE_URL = "AGL_OPENAI_BASE_URL"  # the attempt's gateway: {server}/v1/rollouts/{rid}/attempts/{aid}/v1
AGL_EVENT_URL = "AGL_EVENT_URL"  # where the reward goes: {server}/v1/rollouts/{rid}/attempts/{aid}/events
AGL_KEY = "AGL_KEY"  # the attempt token (the k8s runner passes it from a Secret)
CALCX_ROLLOUT_ID = "CALCX_ROLLOUT_ID"
CALCX_ATTEMPT_ID = "CALCX_ATTEMPT_ID"

#: What an agent cannot run without.
REQUIRED_VARIABLES = (*REQUIRED_ROW_VARIABLES, AGL_OPENAI_BASE_URL, AGL_EVENT_URL, AGL_KEY)

# -- optional settings (runners and users) -------------------------------------------------------
CALCX_AGENT_TIMEOUT_S = "CALCX_AGENT_TIMEOUT_S"  # the agent's own bound on the whole run
CALCX_MODEL_MAX_RETRIES = "CALCX_MODEL_MAX_RETRIES"
CALCX_CALCULATOR_TIMEOUT_S = "CALCX_CALCULATOR_TIMEOUT_S"
CALCX_CALCULATOR_CMD = "CALCX_CALCULATOR_CMD"  # a JSON list: the command that starts the calculator
CALCX_AGENT_TOOL_ROUNDS = "CALCX_AGENT_TOOL_ROUNDS"  # rounds of calculator calls before the agent must answer
CALCX_AGENT_PROMPT = "CALCX_AGENT_PROMPT"  # which system message the agent opens its chat with

#: One round: the agent's calls go out together, their results come back, then it must answer.
TOOL_ROUNDS_DEFAULT = 1
#: Every round is one more model call; past this the run would outgrow its deadline and context.
TOOL_ROUNDS_MAX = 16


def parse_tool_rounds(value: object, *, what: str = CALCX_AGENT_TOOL_ROUNDS) -> int:
    """A tool-round count (an int, or its text) checked against 1..TOOL_ROUNDS_MAX; ValueError
    naming ``what`` otherwise. The agent reads its variable with it, the trainer its setting."""
    text = str(value).strip()[:100]
    if isinstance(value, bool) or not isinstance(value, int | str) or not text.isdigit():
        raise ValueError(f"{what} must be a whole number of tool rounds from 1 to {TOOL_ROUNDS_MAX}, got {text!r}")
    rounds = int(text)
    if not 1 <= rounds <= TOOL_ROUNDS_MAX:
        raise ValueError(
            f"{what}={rounds} is out of range: 1 (one round of calls, then the answer) " f"to {TOOL_ROUNDS_MAX}"
        )
    return rounds


#: The agent's system messages, by name (their texts: calcx.agent.answer.SYSTEM_MESSAGES): `plain`
#: says a calculator is there; `calculator-first` tells the model to leave every computation to it
#: and shows a call written the way the hermes parser reads it; `calculator-steps` asks for the
#: reasoning in words, step by step, each step's number from the calculator, in plain expressions.
AGENT_PROMPTS = ("plain", "calculator-first", "calculator-steps")
AGENT_PROMPT_DEFAULT = "plain"


def parse_agent_prompt(value: object, *, what: str = CALCX_AGENT_PROMPT) -> str:
    """A system message's name from AGENT_PROMPTS; ValueError naming ``what`` otherwise."""
    text = str(value).strip()[:100] if isinstance(value, str) else repr(value)[:100]
    if text not in AGENT_PROMPTS:
        raise ValueError(
            f"{what} must name one of the agent's system messages ({', '.join(AGENT_PROMPTS)}), " f"got {text!r}"
        )
    return text


# -- the controller's own (never an agent's) ----------------------------------------------------
CALCX_KEY = "CALCX_KEY"  # the server key: server, controller and trainer only
CALCX_ZYGOTE_PROFILE_DIR = "CALCX_ZYGOTE_PROFILE_DIR"  # tuning aid: where the agent worker dumps profiles

# -- what a local agent inherits from its runner ----------------------------------------------
#: The runner's own variables a local agent (and its calculator) may inherit: the contract's
#: settings plus what a Python process needs to start, find its files and decode text. Nothing
#: else of the controller's environment (the server key, tracker, hub and cloud credentials,
#: proxies) reaches an agent; the rollout's own variables (the row's, the attempt token) come
#: from the claim on top. The k8s runner gives a Job only the claim's variables.
AGENT_INHERITED_NAMES: frozenset[str] = frozenset(
    {
        CALCX_AGENT_TIMEOUT_S,
        CALCX_MODEL_MAX_RETRIES,
        CALCX_CALCULATOR_TIMEOUT_S,
        CALCX_CALCULATOR_CMD,
        CALCX_AGENT_TOOL_ROUNDS,
        CALCX_AGENT_PROMPT,
        CALCX_ZYGOTE_PROFILE_DIR,
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "VIRTUAL_ENV",
    }
)
#: Prefixes of inherited names: locale (LC_*), the interpreter's own settings (PYTHON*: import
#: path, hash seed, unbuffered output) and a PEX's (PEX_*: where it unpacks; __PEX_*: the import
#: path a venv-mode PEX hands the processes its interpreter starts).
AGENT_INHERITED_PREFIXES: tuple[str, ...] = ("LC_", "PYTHON", "PEX_", "__PEX_")


def agent_inherits(name: str) -> bool:
    """Whether a runner's variable ``name`` may reach a local agent (see AGENT_INHERITED_NAMES)."""
    return name in AGENT_INHERITED_NAMES or name.startswith(AGENT_INHERITED_PREFIXES)


def agent_base_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a runner's environment ``env`` that a local agent may inherit."""
    return {name: value for name, value in env.items() if agent_inherits(name)}


# -- what the services `calcx train` starts inherit from the trainer ------------------------------
#: Beyond a local agent's allowlist (the controller hands that on to its agents), the server and
#: controller `calcx train` starts inherit calcx's own settings (CALCX_*; the run's key is set on
#: top) and the proxy settings the server's model calls may need. Nothing else of the trainer's
#: environment: its tracker, hub and cloud credentials (WANDB_API_KEY, HF_TOKEN, AWS_*) stay there.
SERVICE_INHERITED_NAMES: frozenset[str] = frozenset(
    {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"}
)
SERVICE_INHERITED_PREFIXES: tuple[str, ...] = ("CALCX_",)


def service_base_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a trainer's environment ``env`` that the services it starts may inherit."""
    return {
        name: value
        for name, value in env.items()
        if agent_inherits(name) or name in SERVICE_INHERITED_NAMES or name.startswith(SERVICE_INHERITED_PREFIXES)
    }


# -- what a rollout's env_map may not set --------------------------------------------------------
#: Prefixes only calcx sets: the attempt's gateway, event URL and token (AGL_*), its ids and the
#: agent's settings, the calculator command among them (CALCX_*).
CALCX_PREFIX = "CALCX_"
RESERVED_PREFIXES: tuple[str, ...] = (CALCX_PREFIX, AGL_PREFIX)
#: The dynamic loader's settings (LD_PRELOAD, LD_LIBRARY_PATH, ...): code loaded into the agent.
LOADER_PREFIX = "LD_"


def reserved_problem(name: str) -> str | None:
    """Why a rollout's env_map may not set ``name`` (None when it may). A row picks data for its
    agent (QUESTION, RESULT, its own fields), never what the agent runs or whom it trusts: calcx's
    own names, the runner's variables an agent inherits (PATH, PYTHON*, ...) and the loader's."""
    if name.startswith(RESERVED_PREFIXES):
        return f"{name} is set by calcx, not by a row ({', '.join(p + '*' for p in RESERVED_PREFIXES)} are reserved)"
    if agent_inherits(name) or name.startswith(LOADER_PREFIX):
        return f"{name} is the runner's setting of the agent process, not data a row may set"
    return None


# -- the rule for values ---------------------------------------------------------------------
#: Linux refuses one environment string ("NAME=value" plus its NUL) longer than MAX_ARG_STRLEN.
MAX_ENV_BYTES = 128 * 1024 - 1
#: Kubernetes' rule for a container's env names (letters, digits, '_', '-', '.'; no leading digit).
_NAME_RE = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def env_problem(name: object, value: object) -> str | None:
    """Why no runner can hand ``name=value`` to an agent (None when every runner can).

    One rule for the local runner (a process environment), the k8s runner (a Job's env list)
    and the server (which refuses such a row when the rollout is created). It is the union of
    the restrictions the two runners applied: a rollout may be claimed by either runner, so
    a row is accepted only when both can carry it.
    - the name: a process environment cannot hold an empty name, '=' or NUL; Kubernetes also
      refuses anything outside ``[-._a-zA-Z][-._a-zA-Z0-9]*``.
    - the value: a string without NUL, valid Unicode (no lone surrogate, which has no UTF-8
      form), and ``NAME=value`` within Linux's per-string limit (MAX_ENV_BYTES).
    A retry cannot help with any of these: the input itself is the cause.
    """
    if not isinstance(name, str) or not name:
        return f"environment variable name {name!r} must be a non-empty string"
    if "=" in name or "\x00" in name:
        return f"environment variable name {name!r} contains '=' or a NUL character"
    if not _NAME_RE.fullmatch(name):
        return (
            f"environment variable name {name!r} is not a valid C identifier-like name "
            "(letters, digits, '_', '-' or '.', not starting with a digit)"
        )
    if not isinstance(value, str):
        return f"environment variable {name} must be a string, got {type(value).__name__}"
    nul = value.find("\x00")
    if nul >= 0:
        return (
            f"environment variable {name} contains a NUL character (at offset {nul}), "
            "which no process environment can hold; remove it from the input row"
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"environment variable {name} is not valid Unicode ({exc.reason} at offset {exc.start}); fix the input encoding"
    if len(name.encode("utf-8")) + 1 + size > MAX_ENV_BYTES:
        return (
            f"environment variable {name} is {size} bytes; Linux limits one variable to "
            f"{MAX_ENV_BYTES} bytes including its name; shorten the input row"
        )
    return None
