"""The model registry (model name, inference endpoints, policy version), kept across restarts."""

from __future__ import annotations

import json
from typing import Any

from calcx.server.store.database import Database, dumps

_KEY = "model_registry"  # its row in the kv table


class Registry:
    def __init__(self, db: Database) -> None:
        self._db = db

    def get(self) -> dict[str, Any] | None:
        row = self._db.execute("SELECT value FROM kv WHERE key = ?", (_KEY,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, value: dict[str, Any]) -> None:
        with self._db.tx() as db:
            db.execute(
                "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (_KEY, dumps(value)),
            )
