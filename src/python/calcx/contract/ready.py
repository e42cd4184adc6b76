"""The lines a started process prints on stdout once it serves, and the patterns a parent
waits for (`calcx rehearse`, the trainer's local services, the controller's worker, tests).

Each line and its pattern sit side by side, so a change to one cannot leave the other behind.
"""

from __future__ import annotations

import re

SERVER_READY_PREFIX = "calcx server listening on "
STUB_LLM_READY_PREFIX = "calcx stub-llm: serving on "
CONTROLLER_READY_PREFIX = "calcx controller: ready"
#: The local runner's pre-forked agent worker (zygote): the whole line, compared exactly.
WORKER_READY_LINE = "calcx-zygote: ready"

#: Group 1: the server's URL.
SERVER_READY = re.compile(re.escape(SERVER_READY_PREFIX) + r"(http://\S+)")
#: Group 1: the stub model's OpenAI base URL (ends in /v1).
STUB_LLM_READY = re.compile(re.escape(STUB_LLM_READY_PREFIX) + r"(http://\S+)")
CONTROLLER_READY = re.compile(re.escape(CONTROLLER_READY_PREFIX))


def server_ready_line(url: str, public_url: str, db: str) -> str:
    """Printed once the server's socket listens (`url`: where it listens)."""
    return f"{SERVER_READY_PREFIX}{url} (public {public_url}, db {db})"


def stub_llm_ready_line(base_url: str, mode: str, questions: int) -> str:
    """Printed once the stub model's socket listens (`base_url`: its OpenAI base URL)."""
    return f"{STUB_LLM_READY_PREFIX}{base_url} (mode {mode}, {questions} scripted questions)"


def controller_ready_line(runner: str) -> str:
    """Printed once the controller's runner started and it claims work."""
    return f"{CONTROLLER_READY_PREFIX} (runner {runner})"
