"""verl's file logger, made appending: a second start of the run (verl's `Tracking`, as its driver
builds it) continues the metrics file instead of erasing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl.utils import tracking

from calcx.trainer.workers.metrics_file import install_appending_file_logger


@pytest.fixture
def restore_verl_file_logger():
    original = tracking.FileLogger
    yield
    setattr(tracking, "FileLogger", original)  # noqa: B010


def _start(step: int) -> None:
    logger = tracking.Tracking(project_name="calcx", experiment_name="r", default_backend=["file"])
    logger.log(data={"x": step}, step=step)
    del logger


def test_a_second_start_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_verl_file_logger) -> None:
    path = tmp_path / "report" / "metrics.jsonl"
    path.parent.mkdir()
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    _start(1)
    _start(2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2]  # verl's own: "wb"
    install_appending_file_logger()
    install_appending_file_logger()  # installing twice wraps verl's logger once
    _start(3)
    _start(4)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2, 3, 4]
    assert getattr(tracking.FileLogger, "calcx_base") is tracking.FileLogger.__mro__[1]  # noqa: B009
