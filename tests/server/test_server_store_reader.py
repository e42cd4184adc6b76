"""The store's read-only reader (`calcx.server.store.reader`, what `calcx runs table` reads a run's
store with) reads what the server's store wrote, beside a live server's connection too, and never
writes: no file is made for a store that is not there, and the file's bytes stay as they were."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from calcx.api.models import RecordedCall, RolloutCreate
from calcx.contract.failures import FailureReason
from calcx.server.store import CallRecord, RolloutStore
from calcx.server.store.reader import StoreReader

CLOCK = iter(float(t) for t in range(100, 10_000))


def _written(path: Path) -> RolloutStore:
    """Two rollouts through the server's store: one trained in step 1, one failed once and retried;
    three recorded calls, one of them answered 502."""
    store = RolloutStore(str(path), clock=lambda: next(CLOCK))
    store.rollouts.create(
        [
            RolloutCreate(rollout_id=rid, row={"id": rid}, labels={"run": "r", "step": "1"})
            for rid in ("calcx-train-s1-a", "calcx-train-s1-b")
        ]
    )
    store.attempts.claim("c", 2, 30.0)
    for rid, seq_tokens in (("calcx-train-s1-a", [7, 8]), ("calcx-train-s1-b", [])):
        store.calls.record(
            CallRecord(
                rid,
                "1",
                json.dumps({"n": rid}).encode(),
                b'{"choices": []}',
                200,
                1.5,
                0,
                "http://v/v1",
                [1],
                seq_tokens,
                [0.0] * len(seq_tokens),
            )
        )
    store.calls.record(CallRecord("calcx-train-s1-b", "1", b'{"n": 2}', None, 502, 0.5, None, None))
    store.attempts.finish("calcx-train-s1-a", "1", "SUCCEEDED", None, 0, 1.0, None)
    store.attempts.finish("calcx-train-s1-b", "1", "FAILED", FailureReason.CRASH, 1, 1.0, None)
    store.attempts.retry("calcx-train-s1-b")
    store.trained.record("r", 1, ["calcx-train-s1-a"])
    return store


def test_it_reads_what_the_store_wrote_beside_the_live_connection(tmp_path: Path) -> None:
    store = _written(tmp_path / "calcx.db")
    try:
        with StoreReader(tmp_path / "calcx.db") as reader:
            times = dict(reader.rollout_times())
            assert list(times) == ["calcx-train-s1-a", "calcx-train-s1-b"]
            assert reader.first_trained_created() == {1: times["calcx-train-s1-a"]}
            assert [json.loads(spec)["row"] for spec, _, _ in reader.rollout_specs()] == [
                {"id": "calcx-train-s1-a"},
                {"id": "calcx-train-s1-b"},
            ]
            assert sorted(reader.attempt_states()) == [
                ("calcx-train-s1-a", "SUCCEEDED"),
                ("calcx-train-s1-b", "FAILED"),
                ("calcx-train-s1-b", "QUEUED"),
            ]
            assert set(reader.last_finished()) == {"calcx-train-s1-a", "calcx-train-s1-b"}
            answered = list(reader.answered_calls())
            assert [(c.rollout_id, c.attempt_id, c.seq, c.request) for c in answered] == [
                ("calcx-train-s1-a", "1", 0, {"n": "calcx-train-s1-a"}),
                ("calcx-train-s1-b", "1", 0, {"n": "calcx-train-s1-b"}),
            ]
            # the same models the API answers with
            assert answered == [
                c
                for rid in ("calcx-train-s1-a", "calcx-train-s1-b")
                for c in map(RecordedCall.model_validate, store.calls.query(rid))
                if c.status_code == 200
            ]
            assert [(rid, latency) for rid, _, latency in reader.answered_call_times()] == [
                ("calcx-train-s1-a", 1.5),
                ("calcx-train-s1-b", 1.5),
            ]
            assert reader.call_outcomes("calcx-train-s1-a") == [(200, b'{"choices": []}', True)]
            assert reader.call_outcomes("calcx-train-s1-b") == [(200, b'{"choices": []}', False), (502, None, False)]
            assert reader.call_outcomes("nope") == []
            # one attempt's answered calls (the 502 left out), and each rollout's state and latest attempt
            assert reader.attempt_calls("calcx-train-s1-b", 1) == [answered[1]]
            assert reader.attempt_calls("calcx-train-s1-b", 2) == []
            assert [(rid, spec["row"], state, latest) for rid, spec, state, _, latest in reader.rollout_records()] == [
                ("calcx-train-s1-a", {"id": "calcx-train-s1-a"}, "SUCCEEDED", 1),
                ("calcx-train-s1-b", {"id": "calcx-train-s1-b"}, "QUEUED", 2),
            ]
    finally:
        store.close()


def test_a_record_that_is_not_a_json_object_reads_as_no_message(tmp_path: Path) -> None:
    """Rows written by hand (tests, an older gateway) may hold text that is no JSON object: the
    request reads as {}, the response as None, so counting tool use finds nothing in them."""
    _written(tmp_path / "calcx.db").close()
    con = sqlite3.connect(tmp_path / "calcx.db")
    con.execute("UPDATE calls SET request = '[1]', response = 'not json' WHERE rollout_id = 'calcx-train-s1-a'")
    con.commit()
    con.close()
    with StoreReader(tmp_path / "calcx.db") as reader:
        first = next(iter(reader.answered_calls()))
    assert (first.rollout_id, first.request, first.response) == ("calcx-train-s1-a", {}, None)


def test_it_never_writes(tmp_path: Path) -> None:
    _written(tmp_path / "calcx.db").close()
    before = hashlib.sha256((tmp_path / "calcx.db").read_bytes()).hexdigest()
    with StoreReader(tmp_path / "calcx.db") as reader:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader._conn.execute("DELETE FROM rollouts")
        assert len(list(reader.rollout_times())) == 2
    assert hashlib.sha256((tmp_path / "calcx.db").read_bytes()).hexdigest() == before
    with pytest.raises(FileNotFoundError, match="no store file"):
        StoreReader(tmp_path / "absent.db")
    assert not (tmp_path / "absent.db").exists()
