"""Real servers for the agent tests: the stub LLM and an event receiver, on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_harness import SCRIPTED, EventLog, event_receiver_app

from calcx.common.serving import ThreadedServer
from calcx.stub_llm.app import create_app
from calcx.stub_llm.script import Script


@pytest.fixture(scope="session")
def stub_server() -> Iterator[ThreadedServer]:
    script = Script({question: expression for question, (expression, _) in SCRIPTED.items()})
    with ThreadedServer(create_app(script=script)) as server:
        yield server


@pytest.fixture(scope="session")
def event_log() -> EventLog:
    return EventLog()


@pytest.fixture(scope="session")
def event_server(event_log: EventLog) -> Iterator[ThreadedServer]:
    with ThreadedServer(event_receiver_app(event_log)) as server:
        yield server
