"""The server's and the local-runner controller's command lines, as `calcx rehearse` and
`calcx train` start them: the argv they built before, each flag only for the input that asks for
it, and every flag one that `calcx server` or `calcx controller` parses to the value given."""

from __future__ import annotations

import importlib.util
import json

import pytest

from calcx.contract.commands import CONTROLLER_MODULE, SERVER_MODULE, controller_command, server_command
from calcx.controller.__main__ import parse_args as parse_controller_args
from calcx.server.__main__ import build_parser as server_parser

PY = "/opt/py/bin/python3"
URL = "http://127.0.0.1:41234"
AGENT = ["--agent-cmd", json.dumps(["env", "A=1", PY, "-m", "calcx.agent"]), "--worker-cmd", '["w"]']


def test_the_modules_are_the_server_and_the_controller() -> None:
    assert importlib.util.find_spec(SERVER_MODULE + ".__main__") is not None
    assert importlib.util.find_spec(CONTROLLER_MODULE + ".__main__") is not None


def test_server_command_is_the_argv_both_callers_built() -> None:
    assert server_command(PY, host="0.0.0.0", port=0, db="/r/calcx.db", extra_args=["--lease-s", "5"]) == [
        PY,
        "-m",
        "calcx.server",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--db",
        "/r/calcx.db",
        "--log-level",
        "warning",
        "--lease-s",
        "5",
    ]


def test_server_command_parses_to_its_inputs_and_extra_args_win() -> None:
    argv = server_command(PY, host="127.0.0.1", port=4321, db="/r/x.db", extra_args=["--log-level", "debug"])
    args = server_parser().parse_args(argv[3:])
    assert (args.host, args.port, args.db, args.log_level) == ("127.0.0.1", 4321, "/r/x.db", "debug")


def test_controller_command_with_every_input_is_the_trainers_argv() -> None:
    argv = controller_command(
        PY,
        server_url=URL,
        concurrency=32,
        controller_id="calcx-train",
        log_dir="/r/agents",
        agent_commands=AGENT,
        prefork=False,
        sandbox="namespace",
        extra_args=["--claim-timeout-s", "3"],
    )
    assert argv == [
        PY,
        "-m",
        "calcx.controller",
        "--runner",
        "local",
        "--server",
        URL,
        "--concurrency",
        "32",
        "--controller-id",
        "calcx-train",
        "--log-dir",
        "/r/agents",
        *AGENT,
        "--no-prefork",
        "--sandbox",
        "namespace",
        "--claim-timeout-s",
        "3",
    ]


def test_controller_command_with_the_defaults_sets_no_optional_flag() -> None:
    argv = controller_command(PY, server_url=URL, concurrency=8, controller_id="calcx-train")
    head = [PY, "-m", "calcx.controller", "--runner", "local", "--server", URL]
    assert argv == [*head, "--concurrency", "8", "--controller-id", "calcx-train"]
    assert parse_controller_args(argv[3:]).no_prefork is False


@pytest.mark.parametrize(
    "inputs, flag",
    [
        ({"log_level": "debug"}, "--log-level"),
        ({"log_dir": "/r/agents-0"}, "--log-dir"),
        ({"agent_commands": AGENT}, "--agent-cmd"),
        ({"prefork": False}, "--no-prefork"),
        ({"sandbox": "none"}, "--sandbox"),
    ],
)
def test_each_optional_flag_is_there_only_for_its_input(inputs: dict[str, object], flag: str) -> None:
    plain = controller_command(PY, server_url=URL, concurrency=2, controller_id="c")
    given = controller_command(PY, server_url=URL, concurrency=2, controller_id="c", **inputs)  # type: ignore[arg-type]
    assert flag not in plain
    assert flag in given


def test_controller_command_parses_to_its_inputs() -> None:
    argv = controller_command(
        PY,
        server_url=URL,
        concurrency=5,
        controller_id="faults-main",
        log_level="warning",
        log_dir="/r/agents-1",
        agent_commands=AGENT,
        prefork=False,
        sandbox="namespace",
    )
    assert argv[1:3] == ["-m", CONTROLLER_MODULE]
    args = parse_controller_args(argv[3:])
    assert (args.runner, args.server, args.concurrency, args.controller_id) == ("local", URL, 5, "faults-main")
    assert (args.log_level, args.log_dir, args.no_prefork, args.sandbox) == (
        "warning",
        "/r/agents-1",
        True,
        "namespace",
    )
    assert (args.agent_cmd, args.worker_cmd) == (AGENT[1], AGENT[3])


def test_the_rehearsals_controller_is_as_before_and_extra_args_win() -> None:
    """The rehearsal put --no-prefork and --log-dir after its extra arguments; controller_command
    puts them before, which parses the same unless an extra argument sets --log-dir (it now wins)."""
    extra = ["--max-rollouts", "3", "--claim-timeout-s", "1"]
    common = ["--runner", "local", "--server", URL, "--concurrency", "8", "--controller-id", "rehearsal-0"]
    common += ["--log-level", "info"]
    plain = controller_command(
        PY, server_url=URL, concurrency=8, controller_id="rehearsal-0", log_level="info", extra_args=extra
    )
    assert plain == [PY, "-m", "calcx.controller", *common, *extra]
    argv = controller_command(
        PY,
        server_url=URL,
        concurrency=8,
        controller_id="rehearsal-0",
        log_level="info",
        log_dir="/w/agents-0",
        prefork=False,
        extra_args=extra,
    )
    before = [*common, *extra, "--no-prefork", "--log-dir", "/w/agents-0"]
    assert parse_controller_args(argv[3:]) == parse_controller_args(before)
    again = controller_command(
        PY, server_url=URL, concurrency=8, controller_id="c", log_dir="/a", extra_args=["--log-dir", "/b"]
    )
    assert parse_controller_args(again[3:]).log_dir == "/b"
