"""The training ledger: which rollouts each step of a run trained, and which steps a resumed run
rolled back (their weights were lost with the trainer that made them).

A rollout is trained at most once into a run's surviving weights: the `trained_once` index holds
one live record per rollout id, and a step is recorded once until it is rolled back.
"""

from __future__ import annotations

from collections.abc import Sequence

from calcx.contract.labels import RUN_LABEL
from calcx.server.store.database import Conflict, Database, NotFound
from calcx.server.store.run_leases import RunLeases

_CHUNK = 500  # ids per `IN (...)`: far below SQLite's limit on bound parameters


class Trained:
    def __init__(self, db: Database, leases: RunLeases) -> None:
        self._db = db
        self._leases = leases

    def record(self, run: str, step: int, rollout_ids: Sequence[str], owner: str | None = None) -> int:
        """Record that `step` of `run` trained the latest (SUCCEEDED) attempt of each rollout.
        The same batch again is a no-op (a resent request); anything that would train a rollout
        twice, a step twice, a rollout that did not succeed or one of another run is refused.
        Returns how many rollouts the step holds. `owner`: the writing trainer's lease owner id;
        refused (LeaseLost) when another trainer holds the run's lease."""
        ids = list(dict.fromkeys(rollout_ids))
        now = self._db.clock()
        with self._db.tx() as db:
            self._leases.fence(db, run, owner)
            held = {
                rid
                for (rid,) in db.execute(
                    "SELECT rollout_id FROM trained WHERE run = ? AND step = ? AND rolled_back_at IS NULL", (run, step)
                )
            }
            if held:
                if held == set(ids):
                    return len(held)
                raise Conflict(
                    f"step {step} of run {run!r} is already recorded with another batch of {len(held)} "
                    "rollout(s); a resumed run rolls back the steps after its checkpoint first"
                )
            rows: dict[str, tuple[str, int, str | None]] = {}
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                marks = ",".join("?" * len(chunk))
                for rid, state, latest, label in db.execute(
                    f"SELECT rollout_id, state, latest_attempt, json_extract(spec, ?) FROM rollouts "  # noqa: S608
                    f"WHERE rollout_id IN ({marks})",
                    [f'$.labels."{RUN_LABEL}"', *chunk],
                ):
                    rows[rid] = (state, latest, label)
                for rid, earlier, earlier_run in db.execute(
                    f"SELECT rollout_id, step, run FROM trained WHERE rolled_back_at IS NULL "  # noqa: S608
                    f"AND rollout_id IN ({marks})",
                    chunk,
                ):
                    raise Conflict(
                        f"rollout {rid!r} was already trained in step {earlier} of run {earlier_run!r}; "
                        "a rollout is trained at most once"
                    )
            for rid in ids:
                if rid not in rows:
                    raise NotFound(f"no rollout {rid!r}")
                state, latest, label = rows[rid]
                if state != "SUCCEEDED":
                    raise Conflict(f"rollout {rid!r} is {state}; only a SUCCEEDED rollout can be trained")
                if label != run:
                    raise Conflict(f"rollout {rid!r} belongs to run {label!r}, not {run!r}")
            db.executemany(
                "INSERT INTO trained (run, step, rollout_id, attempt_no, trained_at) VALUES (?, ?, ?, ?, ?)",
                [(run, step, rid, rows[rid][1], now) for rid in ids],
            )
        return len(ids)

    def rewind(self, run: str, after_step: int, owner: str | None = None) -> list[int]:
        """Mark the records of `run`'s steps after `after_step` rolled back; returns those steps.
        Fenced by the run's lease as `record` is."""
        now = self._db.clock()
        with self._db.tx() as db:
            self._leases.fence(db, run, owner)
            steps = [
                step
                for (step,) in db.execute(
                    "SELECT DISTINCT step FROM trained WHERE run = ? AND step > ? AND rolled_back_at IS NULL "
                    "ORDER BY step",
                    (run, after_step),
                )
            ]
            db.execute(
                "UPDATE trained SET rolled_back_at = ? WHERE run = ? AND step > ? AND rolled_back_at IS NULL",
                (now, run, after_step),
            )
        return steps
