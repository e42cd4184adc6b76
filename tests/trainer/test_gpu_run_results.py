"""What src/gpu/h200_run.sh hands back from a run: a machine with no network returns files of at
most 16 MiB each, so a run's tarball and its store come apart, and either one larger than that comes
back in pieces that join into the whole (a run's 17.8 MB tarball was once left behind whole).
"""

from __future__ import annotations

import io
import os
import sqlite3
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

from gpu_run_dirs import ended_run, store_path

RUN_SCRIPT = Path(__file__).resolve().parents[2] / "src" / "gpu" / "h200_run.sh"
RETURN_LIMIT = 16 * 1024 * 1024
TOKENS = os.urandom(64)


def _run_dir(work: Path, name: str, log_bytes: int, store_bytes: int) -> Path:
    run = ended_run(work, name)
    (run / "train.log").write_bytes(os.urandom(log_bytes))  # random bytes: gzip cannot shrink them
    with sqlite3.connect(store_path(run)) as db:
        db.execute(
            "CREATE TABLE calls (id INTEGER PRIMARY KEY, prompt_token_ids BLOB, response_token_ids BLOB,"
            " response_logprobs BLOB, request TEXT)"
        )
        db.execute("CREATE TABLE padding (data BLOB)")
        db.execute("INSERT INTO calls VALUES (1, ?, ?, ?, 'a recorded request')", (TOKENS, TOKENS, TOKENS))
        db.execute("INSERT INTO padding VALUES (?)", (os.urandom(store_bytes),))
    return run


def _env(work: Path) -> dict[str, str]:
    """The script's environment: its work folder and this Python as the machine's."""
    return {**os.environ, "WORK": str(work), "PYTHON": sys.executable}


def _status(work: Path, name: str, out: Path) -> None:
    done = subprocess.run(
        ["bash", str(RUN_SCRIPT), "status", name, str(out)], capture_output=True, text=True, timeout=120, env=_env(work)
    )
    assert done.returncode == 0, done.stderr


def _joined(out: Path, tarball: str) -> tarfile.TarFile:
    whole = out / tarball
    data = whole.read_bytes() if whole.exists() else b"".join(p.read_bytes() for p in sorted(out.glob(f"{tarball}.*")))
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")


def test_a_large_run_comes_back_in_pieces_that_join_into_the_whole(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "tooluse", log_bytes=20 * 1024 * 1024, store_bytes=18 * 1024 * 1024)
    out = tmp_path / "out"
    _status(tmp_path, "tooluse", out)
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    assert all(size <= RETURN_LIMIT for size in sizes.values()), sizes
    assert "tooluse.tar.gz" not in sizes and "tooluse.tar.gz.01" in sizes  # split, not left whole
    with _joined(out, "tooluse.tar.gz") as tar:
        assert "store-slim.db" not in tar.getnames()
        log = tar.extractfile("train.log")
        assert log is not None and log.read() == (run / "train.log").read_bytes()
    with _joined(out, "tooluse-store.tar.gz") as tar:  # what is in the slim store: test_anchor_config.py
        assert tar.getnames() == ["store-slim.db"]
        store = tar.extractfile("store-slim.db")
        assert store is not None
        (tmp_path / "store-slim.db").write_bytes(store.read())
    with sqlite3.connect(tmp_path / "store-slim.db") as db:
        assert db.execute("SELECT request FROM calls").fetchall() == [("a recorded request",)]


def test_a_small_run_comes_back_as_two_whole_tarballs(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "sync", log_bytes=1024, store_bytes=1024)
    (run / "starts.jsonl").write_text('{"first_step": 1}\n')  # calcx train's line a start
    out = tmp_path / "out"
    out.mkdir()
    for stale in ("sync.tar.gz.00", "sync.tar.gz.01"):  # pieces of an earlier, larger status into the same OUT
        (out / stale).write_bytes(b"old")
    _status(tmp_path, "sync", Path(os.path.relpath(out)))  # a relative OUT, as a person types it
    assert sorted(p.name for p in out.iterdir()) == ["sync-store.tar.gz", "sync.tar.gz"]
    with _joined(out, "sync.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["started", "starts.jsonl", "train.log"]


def test_stopping_the_campaign_stops_the_runs_still_going_and_no_ended_ones(tmp_path: Path) -> None:
    """`stop campaign` ends every run still going, tool-use runs of another profile too, and leaves
    alone the pid file of a run that ended (that pid may be another process's by now)."""
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # holds an ended run's old pid
    try:
        run = ended_run(tmp_path, "tooluse-lr5e-6-joined")
        (run / "pid").write_text(f"{other.pid}\n")
        (run / "ended").write_text("1\n")
        (tmp_path / "results" / "campaign.pid").write_text("2147483646\n")
        env = _env(tmp_path)
        stop = ["bash", str(RUN_SCRIPT), "stop", "campaign"]
        assert subprocess.run(stop, capture_output=True, timeout=60, env=env).returncode == 0
        assert other.poll() is None
        (run / "ended").unlink()  # now a run still going: its process group is ended
        reaper = threading.Thread(target=other.wait)  # reaped at once, so the stop sees it gone
        reaper.start()
        assert subprocess.run(stop, capture_output=True, timeout=60, env=env).returncode == 0
        reaper.join(30)
        assert other.returncode == -15
    finally:
        other.kill()
        other.wait()


def _wait(work: Path, name: str, seconds: int, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUN_SCRIPT), "wait", name, str(seconds), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(work),
    )


def test_a_wait_called_before_its_run_starts_waits_for_it_and_brings_it_back(tmp_path: Path) -> None:
    """A wait called right after `launch` finds no run yet (the campaign's setup comes first): it waits
    for the run within the same SECONDS, then for its end, and packs OUT."""
    (tmp_path / "results").mkdir()
    starter = threading.Timer(3.0, lambda: _run_dir(tmp_path, "calculator-bonus", log_bytes=1024, store_bytes=1024))
    starter.start()
    try:
        done = _wait(tmp_path, "calculator-bonus", 60, tmp_path / "out")
    finally:
        starter.join()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "running=no" in done.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "calculator-bonus-store.tar.gz",
        "calculator-bonus.tar.gz",
    ]


def test_a_wait_for_a_run_that_never_starts_ends_at_its_deadline_and_says_so(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "campaign.log").write_text("setup: join + verify + model conversion 73 s\n")
    done = _wait(tmp_path, "sync", 3, tmp_path / "out")
    assert done.returncode == 3
    assert "run sync: not started" in done.stdout and "model conversion 73 s" in done.stdout
