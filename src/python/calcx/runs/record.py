"""One run's record: `run.yaml` (what ran, written once, by hand or by the run's campaign) and the
headline its metrics give (the last validation's accuracy by source, with its standard error).

The headline is computed, not written down: verl logs `val-core/<source>/reward/mean@1` per
validation, each problem scores 0 or 1, so the accuracy's standard error is the binomial
sqrt(p (1 - p) / n) over the set's row count that run.yaml records.

A fact the run left no trace of is written `unknown` (UNKNOWN), never guessed: any required field
may say so, and so may a data set's `rows` (its accuracy then has no standard error). A run that
validated on nothing (a warm-up alone) says `validation_sets: []`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RECORD_FILE = "run.yaml"
METRICS_FILE = "metrics.jsonl"
# what every run.yaml must say (dotted paths), so that a run can be rebuilt and its figures read
REQUIRED = (
    "name",
    "date",
    "commit",
    "artifact.name",
    "artifact.sha256",
    "command",
    "profile",
    "mode",
    "steps",
    "model",
    "machine.gpu",
    "train_sets",
    "validation_sets",
)
VAL_PREFIX = "val-core/"
VAL_SUFFIX = "/mean@1"
# the accepted value of a fact that is not known (a commit nobody wrote down, a set's size per source)
UNKNOWN = "unknown"


class RecordError(ValueError):
    """A run folder whose run.yaml or metrics cannot be read as a record."""


@dataclass(frozen=True)
class DataSet:
    file: str
    rows: int | None  # None: run.yaml says `unknown`
    source: str


@dataclass(frozen=True)
class Accuracy:
    source: str
    accuracy: float
    n: int  # 0: the set's size is not known

    @property
    def standard_error(self) -> float:
        return math.sqrt(self.accuracy * (1 - self.accuracy) / self.n) if self.n else math.nan


def _dig(data: Mapping[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _sets(data: Mapping[str, Any], key: str, where: Path, may_be_empty: bool = False) -> list[DataSet]:
    items = data.get(key)
    if not isinstance(items, list) or not (items or may_be_empty):
        raise RecordError(f"{where}: '{key}' must be a list of {{file, rows, source}}")
    sets = []
    for item in items:
        try:
            rows = None if item["rows"] == UNKNOWN else int(item["rows"])
            sets.append(DataSet(str(item["file"]), rows, str(item["source"])))
        except (KeyError, TypeError, ValueError):
            raise RecordError(
                f"{where}: each of '{key}' needs file, rows (a number) and source; got {item!r}"
            ) from None
    return sets


@dataclass(frozen=True)
class RunRecord:
    folder: Path
    data: dict[str, Any]
    train_sets: list[DataSet]
    validation_sets: list[DataSet]

    @property
    def name(self) -> str:
        return str(self.data["name"])

    def last_validation(self) -> tuple[int, list[Accuracy]] | None:
        """(step, accuracy by source) of the run's last validation, from its metrics file."""
        path = self.folder / METRICS_FILE
        if not path.is_file():
            return None
        by_step: dict[int, dict[str, float]] = {}
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                step, values = int(row["step"]), row["data"]
            except (ValueError, KeyError, TypeError):
                raise RecordError(f"{path}: line {number} is not a metrics line") from None
            for key, value in values.items():
                if key.startswith(VAL_PREFIX) and key.endswith(VAL_SUFFIX) and isinstance(value, int | float):
                    by_step.setdefault(step, {}).setdefault(key[len(VAL_PREFIX) :].split("/", 1)[0], float(value))
        if not by_step:
            return None
        step = max(by_step)
        sizes: dict[str, int] = {}
        for item in self.validation_sets:
            sizes[item.source] = sizes.get(item.source, 0) + (item.rows or 0)
        return step, [Accuracy(source, value, sizes.get(source, 0)) for source, value in sorted(by_step[step].items())]


def read_record(folder: str | Path) -> RunRecord:
    """The record of one run folder; RecordError naming the file and the key when it is incomplete."""
    folder = Path(folder)
    path = folder / RECORD_FILE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RecordError(f"{path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise RecordError(f"{path}: not YAML ({exc})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: expected a mapping of {', '.join(REQUIRED)}")
    missing = [key for key in REQUIRED if _dig(data, key) in (None, "")]
    if missing:
        raise RecordError(f"{path}: missing {', '.join(missing)} (every run.yaml says {', '.join(REQUIRED)})")
    expected = f"{data['date']}-{data['name']}"
    if folder.name != expected:
        raise RecordError(f"{path}: a run named {data['name']!r} of {data['date']} lives in a folder {expected}/")
    return RunRecord(
        folder, data, _sets(data, "train_sets", path), _sets(data, "validation_sets", path, may_be_empty=True)
    )
