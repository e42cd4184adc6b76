"""`calcx controller --sandbox namespace`: real server, controller and agents. A hostile agent
cannot write the user's files, read $HOME, see the controller or read another running agent's
files; the real agent (stub LLM, real MCP calculator) still finishes with its reward; a machine
without namespaces is refused at start."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import KEY, claim, client_of, make_stack, spec, started_pid, wait_gone, wait_terminal

from calcx.controller.base import RunResult
from calcx.controller.local_runner import LocalRunner, default_agent_command
from calcx.controller.sandbox import NAMESPACE, NamespaceSandbox, SandboxUnavailable
from calcx.procs.procutil import descendants
from calcx.rehearse.stack import python_env

HOSTILE = Path(__file__).resolve().with_name("hostile_agent.py")
SANDBOX = ["--sandbox", "namespace"]


@pytest.fixture(scope="module", autouse=True)
def namespaces() -> None:
    """Skip only where this machine cannot seal an agent (CI's can: .ci/expected-skips.txt does
    not list these tests), saying why."""
    try:
        NamespaceSandbox.plan(default_agent_command(), dict(os.environ), default_agent=True).check()
    except SandboxUnavailable as exc:
        pytest.skip(reason=f"namespaces are not available on this machine: {exc}")


@pytest.fixture()
def outside() -> Iterator[Path]:
    """A directory of the user's outside /tmp (so that only the read-only root keeps an agent out)."""
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else os.path.expanduser("~")
    path = Path(tempfile.mkdtemp(prefix="calcx-sandbox-test-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _wait_for(path: Path, text: str, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in (content := path.read_text(errors="replace")):
            return content
        time.sleep(0.05)
    raise AssertionError(f"{path} never said {text!r}")


def _report(log: Path) -> dict[str, Any]:
    match = re.search(r"^report: (.*)$", log.read_text(errors="replace"), re.M)
    assert match, log.read_text(errors="replace")
    return json.loads(match.group(1))


def test_a_hostile_agent_cannot_reach_the_users_files_the_controller_or_another_agent(
    tmp_path: Path, outside: Path
) -> None:
    control = tmp_path / "control"
    control.mkdir()
    fake_site = outside / "site-packages"  # on the agents' import path: they see it, read-only
    fake_site.mkdir()
    user_dir = outside / "work"  # a directory of the user's the agents are not told about
    user_dir.mkdir()
    user_tmp = tmp_path / "user-tmp"  # under /tmp: the private tmpfs hides it
    user_tmp.mkdir()
    home = outside / "home"
    home.mkdir()
    (home / "credentials").write_text("user-secret\n")
    agent_cmd = json.dumps([sys.executable, str(HOSTILE), str(control)])
    pythonpath = os.pathsep.join([python_env()["PYTHONPATH"], str(fake_site)])
    stack, _ = make_stack(
        tmp_path / "stack",
        rows=1,
        concurrency=2,
        agent_logs=True,
        controller_args=[*SANDBOX, "--agent-cmd", agent_cmd],
        controller_env={"HOME": str(home), "PYTHONPATH": pythonpath},
    )
    with stack:
        client = client_of(stack)
        agents = stack.workdir / "agents-0"
        assert stack.server is not None
        # (d) the holder writes a secret into each place an agent may write, and stays
        client.create_rollouts([spec("holder", {"question": json.dumps({"role": "holder"}), "result": "0"})])
        try:
            held = _wait_for(agents / "holder.1.log", "holding")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the holder: {client.get_rollout('holder').latest_attempt}") from exc
        plan = {
            "role": "probe",
            "file_name": "planted.py",
            "write_into": [str(fake_site), str(user_dir), str(user_tmp), str(outside)],
            "home_file": str(home / "credentials"),
            "pids": [str(stack.controllers[0].pid), str(stack.server.pid), str(os.getpid())],
        }
        client.create_rollouts([spec("probe", {"question": json.dumps(plan), "result": "0"})])
        probe = wait_terminal(client, ["probe"])["probe"]
        assert client.get_rollout("holder").state == "RUNNING"  # the two ran at once
        (control / "release-holder").write_text("")
        holder = wait_terminal(client, ["holder"])["holder"]
    assert probe.state == "SUCCEEDED", probe.latest_attempt.detail
    assert holder.state == "SUCCEEDED", holder.latest_attempt.detail
    report = _report(agents / "probe.1.log")
    breaches: dict[str, Any] = {}  # every check, so that one run names each that failed

    # the seal holds: no mount of it can be undone from inside
    if any(got.startswith("ok") for got in report["unseal"].values()):
        breaches["undid the seal"] = report["unseal"]
    # (a) nothing written into the user's directories; those it sees are read-only to it
    planted = [d for d in plan["write_into"] if (Path(d) / "planted.py").exists()]
    not_read_only = [
        d for d in (fake_site, user_dir, outside) if "Read-only file system" not in report["writes"][str(d)]
    ]
    if planted or not_read_only:
        breaches["a: wrote into the user's directories"] = (planted, report["writes"])
    # (b) $HOME is an empty tmpfs of its own
    if not report["home_file"].startswith("FileNotFoundError"):
        breaches["b: read a file of $HOME"] = report["home_file"]
    # (c) its /proc shows itself alone: not the controller, the server, the test or the holder
    if set(report["processes"]) != {str(report["pid"])}:
        breaches["c: saw other processes"] = report["processes"]
    if any(got.startswith("ok") for got in report["environ"].values()):
        breaches["c: read another process's environ"] = report["environ"]
    # (d) not one of the holder's secrets, where it wrote them or through /proc
    if report["peer_secrets"]:
        breaches["d: read the other agent's files"] = report["peer_secrets"]
    # ... which it wrote, each in its own private /tmp, $HOME and working directory
    written = json.loads(held.split("holding ", 1)[1].splitlines()[0])
    if len(written) != 3:
        breaches["the holder could not write its private /tmp, $HOME and working directory"] = written
    assert not breaches, f"breached: {sorted(breaches)}; {breaches}"


def test_the_real_agent_finishes_with_its_reward_and_its_calculator_is_sealed_with_it(tmp_path: Path) -> None:
    stack, rows = make_stack(tmp_path, rows=3, concurrency=3, controller_args=SANDBOX)
    with stack:
        controller = stack.controllers[0]
        client = client_of(stack)
        before = descendants(controller.pid)
        client.create_rollouts([spec("ok-0", rows[0]), spec("ok-1", rows[1]), spec("slow-0", rows[2], marker="slow=4")])
        launcher = started_pid(controller, "slow-0")
        calculator = _wait_for_calculator(controller.pid, before, launcher)
        own = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("pid", "mnt", "user")}
        theirs = {ns: os.readlink(f"/proc/{calculator}/ns/{ns}") for ns in own}
        done = wait_terminal(client, ["ok-0", "ok-1", "slow-0"], timeout_s=120)
        calls = {rid: client.calls(rid) for rid in done}
    for ns in own:
        assert theirs[ns] != own[ns], (ns, theirs, own)
    for rid, rollout in done.items():
        assert rollout.state == "SUCCEEDED", (rid, rollout.latest_attempt.detail)
        assert rollout.reward == 1.0, rid
        assert len(calls[rid]) == 2, rid  # a tool call, then the answer after the tool's result


def _wait_for_calculator(controller_pid: int, before: set[int], launcher: int, timeout_s: float = 60.0) -> int:
    """The calculator below `launcher`: the process running calcx.agent.calculator."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in descendants(launcher):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"calcx.agent.calculator" in cmdline and b"-c" not in cmdline:
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no calculator below {launcher}: {rollout_processes_of(controller_pid, before)}")


def rollout_processes_of(controller_pid: int, before: set[int]) -> dict[int, str]:
    return {
        pid: Path(f"/proc/{pid}/comm").read_text().strip()
        for pid in descendants(controller_pid) - before
        if Path(f"/proc/{pid}/comm").exists()
    }


def _run_sealed(code: str, deadline_s: float, seen: set[int], act: Callable[[int], bool] | None = None) -> RunResult:
    """`python -c code` through the local runner's sandbox. While it runs, `seen` collects from
    outside every process below the agent's launcher, and `act(launcher)` is called until it
    returns True."""

    async def go() -> RunResult:
        runner = LocalRunner(agent_cmd=[sys.executable, "-c", code], prefork=False, sandbox=NAMESPACE)
        await runner.start()
        acted = act is None
        try:
            task = asyncio.create_task(runner.run(claim(deadline_s=deadline_s)))
            while not task.done():
                for launcher in list(runner._live):
                    seen.update({launcher} | descendants(launcher))
                    acted = acted or act(launcher)  # type: ignore[misc]
                await asyncio.sleep(0.05)
            return await task
        finally:
            await runner.close()

    return asyncio.run(go())


def test_the_deadline_ends_a_sealed_agent_and_everything_in_its_namespace() -> None:
    # a grandchild in a session of its own, as the calculator is: the process group kill misses
    # it, the end of the PID namespace's first process does not
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    seen: set[int] = set()
    result = _run_sealed(code, 3.0, seen)
    assert (result.state, result.reason) == ("FAILED", "timeout"), result
    assert len(seen) >= 3, seen  # the launcher, the agent, its grandchild
    assert wait_gone(seen) == [], f"outlived the deadline: {seen}"


def test_a_sealed_agent_killed_by_a_signal_is_a_crash_naming_it() -> None:
    """The agent is its PID namespace's first process; its launcher passes on its death by a
    signal as its own, so the runner reports it as a plain spawn's."""

    def kill_the_agent(launcher: int) -> bool:
        agents = sorted(descendants(launcher))
        if agents:
            os.kill(agents[0], signal.SIGKILL)
        return bool(agents)

    result = _run_sealed("import time; time.sleep(60)", 60.0, set(), kill_the_agent)
    assert (result.state, result.reason, result.exit_code) == ("FAILED", "crash", -signal.SIGKILL), result
    assert "SIGKILL" in (result.detail or "")


def _controller(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "calcx.controller", "--server", "http://127.0.0.1:9", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_machine_that_cannot_seal_an_agent_is_refused_at_start(tmp_path: Path) -> None:
    """Never a silent fall-back: no `unshare`, or an `unshare` the kernel refuses (what util-linux
    prints where unprivileged user namespaces are off), ends the controller with exit 2."""
    env = {**python_env(), "CALCX_KEY": KEY}
    no_unshare = _controller({**env, "PATH": str(tmp_path)}, *SANDBOX)
    assert no_unshare.returncode == 2, no_unshare.stderr
    assert "--sandbox namespace" in no_unshare.stderr and "`unshare`" in no_unshare.stderr, no_unshare.stderr
    refusing = tmp_path / "unshare"
    refusing.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    refusing.chmod(0o755)
    refused = _controller({**env, "PATH": os.pathsep.join([str(tmp_path), env.get("PATH", "")])}, *SANDBOX)
    assert refused.returncode == 2, refused.stderr
    assert "namespaces are not available here: unshare: unshare failed: Operation not permitted" in refused.stderr
    assert "ready" not in refused.stdout


def test_a_path_the_agent_needs_that_holds_a_hidden_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="holds"):
        NamespaceSandbox.plan(
            ["python3", "-c", "pass"],
            {"PATH": os.defpath, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(tmp_path)},
            default_agent=False,
            cwd=str(tmp_path / "home" / "work"),
        )
