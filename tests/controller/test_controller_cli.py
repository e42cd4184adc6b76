"""`calcx controller --help` lists the flags of the runner it is asked about (local by default),
and a flag of the other runner is rejected with an error that names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from calcx.cli import main as calcx_main

SRC = Path(__file__).resolve().parents[2] / "src" / "python"
LOCAL_FLAGS = ("--agent-cmd", "--no-prefork", "--worker-cmd", "--log-dir", "--sandbox")
K8S_FLAGS = ("--namespace", "--agent-image", "--image-pull-policy", "--kubeconfig", "--max-jobs-per-s", "--job-ttl-s")
COMMON_FLAGS = ("--runner", "--server", "--key-file", "--concurrency", "--shutdown-grace-s")


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        calcx_main(["controller", *argv])
    assert exited.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--runner", "local", "--help"]])
def test_help_lists_the_local_runner_flags_by_default(capsys, argv):
    text = _help(capsys, *argv)
    assert "local runner:" in text and "k8s runner:" not in text
    for flag in LOCAL_FLAGS + COMMON_FLAGS:
        assert flag in text, flag
    for flag in K8S_FLAGS:
        assert flag not in text, flag


@pytest.mark.parametrize("argv", [["--runner", "k8s", "--help"], ["--help", "--runner=k8s"], ["-h", "--runner", "k8s"]])
def test_help_lists_the_k8s_runner_flags_when_asked_for_it(capsys, argv):
    text = _help(capsys, *argv)
    assert "k8s runner:" in text and "local runner:" not in text
    for flag in K8S_FLAGS + COMMON_FLAGS:
        assert flag in text, flag
    for flag in LOCAL_FLAGS:
        assert flag not in text, flag


def test_help_through_the_module_entry_point():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "calcx.controller", "--runner", "k8s", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "--agent-image" in done.stdout and "--namespace" in done.stdout


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--runner", "k8s", "--log-dir", "/tmp/x"], "--log-dir: a flag of the local runner, not of --runner k8s"),
        (["--namespace", "calcx"], "--namespace: a flag of the k8s runner, not of --runner local"),
        (["--runner", "k8s", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--runner", "docker"], "invalid choice: 'docker'"),
    ],
)
def test_wrong_flags_are_rejected_naming_the_problem(capsys, argv, expected):
    with pytest.raises(SystemExit) as exited:
        calcx_main(["controller", *argv, "--key-file", "/nonexistent"])
    assert exited.value.code == 2
    assert expected in capsys.readouterr().err


def test_a_key_on_the_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert calcx_main(["controller", "--key", "controller-test-key-0123456789-abcdef"]) == 2
    err = capsys.readouterr().err
    assert "/proc/PID/cmdline" in err and "CALCX_KEY" in err and "--key-file" in err
    assert "controller-test-key" not in err
