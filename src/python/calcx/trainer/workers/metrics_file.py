"""verl's file logger, appending: a resumed run's metrics continue the run's `metrics.jsonl`.

verl 0.9.1's `FileLogger` opens `$VERL_FILE_LOGGER_PATH` with mode "wb", so every start of a run
erased the steps before it. calcx sets aside the rows after the checkpoint before the run starts
(calcx.trainer.run.resume) and has verl append the rest.
"""

from __future__ import annotations

import os
from typing import Any


def appending_file_logger() -> type:
    """verl's FileLogger, opening its file for appending (same path rule, same `log` and `finish`)."""
    from verl.utils import tracking

    base: Any = getattr(tracking.FileLogger, "calcx_base", tracking.FileLogger)

    class AppendingFileLogger(base):  # type: ignore[misc,valid-type]
        calcx_base = base

        def __init__(self, project_name: str, experiment_name: str) -> None:
            path = os.environ.get("VERL_FILE_LOGGER_PATH")
            if not path:  # verl's own default place, as verl makes it
                super().__init__(project_name, experiment_name)
                return
            self.project_name = project_name
            self.experiment_name = experiment_name
            self.filepath = path
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.fp = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by finish(), as verl's

    return AppendingFileLogger


def install_appending_file_logger() -> None:
    """Make verl's `Tracking` (built in its driver's `fit`) append to the metrics file."""
    from verl.utils import tracking

    setattr(tracking, "FileLogger", appending_file_logger())  # noqa: B010 - a module attribute, not a type
