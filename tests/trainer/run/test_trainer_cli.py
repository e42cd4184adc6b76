"""`calcx train` command line: --help and --print-config stay light, no GPU fails fast and says why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from calcx.trainer.run.cli import run_interruptible

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src" / "python")}
PROBE = (
    "import sys; from calcx.trainer.run.cli import main\n"
    "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
    "heavy = sorted(m for m in ('torch', 'verl', 'ray', 'vllm') if m in sys.modules)\n"
    "print('HEAVY=' + ','.join(heavy), file=sys.stderr); raise SystemExit(code)\n"
)


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60, env=env or ENV, cwd=REPO
    )


def test_help_lists_every_flag_without_importing_heavy_packages() -> None:
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    for flag in (
        "--train-file",
        "--val-file",
        "--model",
        "--agl-base-url",
        "--agl-key-file",
        "--run-name",
        "--async",
        "--runner",
        "--print-config",
        "KEY=VALUE",
    ):
        assert flag in done.stdout
    assert "HEAVY=\n" in done.stderr + "\n" and "HEAVY=torch" not in done.stderr


def test_a_key_on_the_command_line_is_refused() -> None:
    done = _run("--print-config", "--agl-key", "top-secret-0123456789-0123456789-abcdef")
    assert done.returncode == 2
    assert "/proc/PID/cmdline" in done.stderr and "--agl-key-file" in done.stderr and "CALCX_KEY" in done.stderr
    assert "top-secret" not in done.stdout + done.stderr


def test_print_config_composes_without_importing_verl() -> None:
    done = _run("--print-config", "--run-name", "exp7", "trainer.total_epochs=1")
    assert done.returncode == 0, done.stderr
    assert "HEAVY=\n" in done.stderr + "\n"
    shown = yaml.safe_load(done.stdout)
    assert shown["trainer"]["total_epochs"] == 1
    assert shown["trainer"]["experiment_name"] == "exp7"
    assert shown["algorithm"]["adv_estimator"] == "grpo"
    assert "key" not in shown["calcx"] and shown["calcx"]["key_file"] is None
    assert "top-secret" not in done.stdout + done.stderr


def test_print_key_prints_one_key_of_a_profiles_config() -> None:
    """What a script reads of a run (h200_run.sh: the system message a profile's RL runs with)."""
    for profile, prompt in (
        ("gsm8k-h200-calculator-bonus", "plain"),
        ("gsm8k-h200-calculator-first", "calculator-first"),
    ):
        done = _run("--profile", profile, "--print-key", "calcx.agent_prompt")
        assert (done.returncode, done.stdout) == (0, f"{prompt}\n"), done.stderr
        assert "HEAVY=\n" in done.stderr + "\n"
    for key in ("calcx.agent_promt", ""):  # a misspelt key, or a script's empty variable: never a run
        done = _run("--print-key", key)
        assert done.returncode == 2 and f"'{key}' is not a key" in done.stderr and not done.stdout


def test_print_config_reports_a_misspelt_override() -> None:
    done = _run("--print-config", "trainer.totl_epochs=1")
    assert done.returncode == 2
    assert "trainer.totl_epochs" in done.stderr and "not a key" in done.stderr


def test_train_without_gpu_fails_fast_pointing_to_rehearse(tmp_path: Path) -> None:
    env = {**ENV, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "calcx.trainer.run.cli", "--train-file", str(tmp_path / "x.parquet")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 3
    assert "no CUDA GPU was found" in done.stderr and "calcx rehearse" in done.stderr
    assert not (tmp_path / "data").exists()  # failed before generating or starting anything


def test_sigterm_and_the_named_errors_end_a_run_with_a_status_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    before = signal.getsignal(signal.SIGTERM)

    def terminated() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler unwinds this at once
        return 0

    def bad_rows() -> int:
        raise ValueError("row 3: no question")

    def a_bug() -> int:
        raise KeyError("unexpected")

    assert run_interruptible("calcx x", terminated, (ValueError,), interrupted="interrupted; all ended") == 130
    assert run_interruptible("calcx x", bad_rows, (ValueError,)) == 2
    with pytest.raises(KeyError):  # not a named error: not turned into a status
        run_interruptible("calcx x", a_bug, (ValueError,))
    assert capsys.readouterr().err.splitlines() == ["calcx x: interrupted; all ended", "calcx x: row 3: no question"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_every_trainer_command_of_calcx_names_a_module_that_exists() -> None:
    """`calcx train`, `calcx warmup` and `calcx profile-step` are found by module name
    (calcx.cli's table): a module moved without its entry there would fail only when run."""
    probe = (
        "import importlib.util; from calcx.cli import SUBCOMMANDS\n"
        "names = [m for m, _ in SUBCOMMANDS.values() if m.startswith('calcx.trainer.')]\n"
        "missing = [m for m in names if importlib.util.find_spec(m) is None]\n"
        "print(len(names), missing)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=ENV, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 1) == ["3", "[]\n"]
