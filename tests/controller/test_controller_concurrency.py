"""The controller's default concurrency is defined once (calcx.controller.concurrency) and follows
the core count: the CLI and the Controller class both take it from there."""

from __future__ import annotations

import os

from calcx.controller.__main__ import build_parser
from calcx.controller.concurrency import SLOTS_PER_CORE, default_concurrency
from calcx.controller.controller import Controller
from calcx.controller.local_runner import LocalRunner


def test_the_default_follows_the_core_count() -> None:
    assert SLOTS_PER_CORE == 4  # benchmarks/RESULTS.md, "Controller concurrency sweep"
    assert [default_concurrency(n) for n in (1, 2, 16)] == [4, 8, 64]
    assert default_concurrency(0) == 4  # an unknown core count counts as one core
    assert default_concurrency() == SLOTS_PER_CORE * (os.cpu_count() or 1)


def test_the_cli_and_the_controller_use_that_default() -> None:
    for runner in ("local", "k8s"):
        assert build_parser(runner).parse_args([]).concurrency == default_concurrency()
    assert f"here {default_concurrency()}" in build_parser().format_help().replace("\n", " ")
    controller = Controller("http://127.0.0.1:9", "key", LocalRunner(agent_cmd=["true"], prefork=False))
    assert controller.concurrency == default_concurrency()
    assert (
        Controller(
            "http://127.0.0.1:9", "key", LocalRunner(agent_cmd=["true"], prefork=False), concurrency=3
        ).concurrency
        == 3
    )
