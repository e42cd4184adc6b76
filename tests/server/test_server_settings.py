"""One copy of every server default: `calcx server`'s flags and its --help take theirs from
calcx.server.settings.DEFAULTS, and start_server_thread passes settings through."""

from __future__ import annotations

from pathlib import Path

import pytest

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.api.tokens import key_problem
from calcx.server.__main__ import TUNED_SETTINGS, build_parser, main, settings_from_args
from calcx.server.app import create_app
from calcx.server.serve import start_server_thread
from calcx.server.settings import DEFAULTS, ServerSettings

# flag dest -> ServerSettings field
FLAGS = {
    "host": "host",
    "port": "port",
    "db": "store_path",
    "public_url": "public_url",
    "max_tokens_ceiling": "max_tokens_ceiling",
    "max_body_bytes": "max_body_bytes",
    "max_event_body_bytes": "max_event_body_bytes",
    "max_in_flight_per_attempt": "max_in_flight_per_attempt",
    "max_connections": "max_connections",
    "lease_s": "lease_s",
    "max_poll_s": "max_poll_s",
    "upstream_timeout_s": "upstream_timeout_s",
    "upstream_retries": "upstream_retries",
    "abort_retry_s": "abort_retry_s",
    "log_level": "log_level",
    "access_log": "access_log",
    "max_events_per_attempt": "max_events_per_attempt",
    "max_event_bytes_per_attempt": "max_event_bytes_per_attempt",
    "max_calls_per_attempt": "max_calls_per_attempt",
    "max_call_bytes_per_attempt": "max_call_bytes_per_attempt",
    "retain_s": "retain_s",
    "reward_min": "reward_min",
    "reward_max": "reward_max",
}


def test_every_flag_default_is_the_settings_default() -> None:
    args = build_parser().parse_args([])
    assert {dest: getattr(args, dest) for dest in FLAGS} == {dest: getattr(DEFAULTS, f) for dest, f in FLAGS.items()}


def test_help_shows_the_settings_defaults() -> None:
    text = " ".join(build_parser().format_help().split())
    for shown in (
        f"default {DEFAULTS.host}",
        f"default {DEFAULTS.port};",
        f"default {DEFAULTS.max_tokens_ceiling})",
        f"default {DEFAULTS.lease_s:g})",
        f"default {DEFAULTS.max_poll_s:g})",
        f"default {DEFAULTS.upstream_retries})",
        f"default {DEFAULTS.abort_retry_s:g})",
        f"default {DEFAULTS.max_body_bytes // 2**20} MiB",
    ):
        assert shown in text


def test_every_flag_reaches_the_settings_the_server_runs_with() -> None:
    # each tuned flag given a value of its own, unlike every default and every other flag's
    given = {name: type(getattr(DEFAULTS, name))(101 + i) for i, (name, _) in enumerate(TUNED_SETTINGS)}
    argv = [arg for name, value in given.items() for arg in ("--" + name.replace("_", "-"), str(value))]
    argv += ["--host", "0.0.0.0", "--db", "x.db", "--log-level", "debug", "--access-log"]
    settings = settings_from_args(build_parser().parse_args(argv), key="k", port=9, public_url="http://h:9")
    assert {name: getattr(settings, name) for name in given} == given
    assert (settings.host, settings.store_path, settings.log_level, settings.access_log) == (
        "0.0.0.0",
        "x.db",
        "debug",
        True,
    )
    assert (settings.key, settings.port, settings.public_url) == ("k", 9, "http://h:9")


def test_poll_timeouts_are_cut_to_the_longest_poll() -> None:
    s = ServerSettings(max_poll_s=5.0)
    assert (s.poll_timeout(-1), s.poll_timeout(2), s.poll_timeout(60)) == (0.0, 2.0, 5.0)


def test_start_server_thread_passes_settings_through(tmp_path: Path) -> None:
    key = "settings-test-key-0123456789-abcdef"
    thread = start_server_thread(str(tmp_path / "s.db"), key, lease_s=7.0)
    try:
        with CalcxClient(thread.url, key) as c:
            assert c.claim("ctl", max=1, timeout_s=0).lease_s == 7.0
    finally:
        thread.stop()


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_abort_retry_s_must_be_a_finite_number_not_below_zero(
    bad: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALCX_KEY", "settings-test-key-0123456789-abcdef")
    assert main(["--abort-retry-s", bad]) == 2
    assert "--abort-retry-s must be a number of seconds >= 0" in capsys.readouterr().err


def test_a_short_key_is_refused_with_how_to_make_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a port no server can bind: a key let through fails at once (status 1), it never serves
    monkeypatch.setenv("CALCX_KEY", "k" * 31)
    assert main(["--port", "-1", "--db", str(tmp_path / "x.db")]) == 2
    err = capsys.readouterr().err
    assert "31 characters, fewer than 32" in err and "calcx server --new-key" in err
    with pytest.raises(ValueError, match="fewer than 32"):
        create_app(ServerSettings(key="k" * 31, public_url="http://127.0.0.1:1"))
    create_app(ServerSettings(key="k" * 32, public_url="http://127.0.0.1:1"))  # the shortest key accepted


def test_new_key_prints_a_fresh_key_the_server_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--new-key"]) == 0
    first = capsys.readouterr().out.strip()
    assert main(["--new-key"]) == 0
    second = capsys.readouterr().out.strip()
    assert first != second and len(first) >= 32 and key_problem(first) is None


def test_the_configured_reward_range_is_the_one_enforced(tmp_path: Path) -> None:
    key = "settings-test-key-0123456789-abcdef"
    thread = start_server_thread(str(tmp_path / "r.db"), key, reward_min=-1.0, reward_max=10.0)
    try:
        with CalcxClient(thread.url, key) as c:
            c.create_rollouts([{"rollout_id": "r", "row": {"question": "q", "result": "1"}}])
            claim = c.claim("ctl", max=1, timeout_s=5).claims[0]
            c.post_reward("r", claim.attempt_id, 7.5)  # outside Calc-X's [0, 1], inside this server's range
            with pytest.raises(CalcxAPIError, match=r"outside the reward range \[-1, 10\]"):
                c.post_reward("r", claim.attempt_id, 10.5)
            assert c.get_rollout("r").reward == 7.5
    finally:
        thread.stop()


def test_a_key_on_the_command_line_is_refused_saying_where_keys_come_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--key", "settings-test-key-0123456789-abcdef", "--db", str(tmp_path / "x.db")]) == 2
    err = capsys.readouterr().err
    assert "/proc/PID/cmdline" in err and "CALCX_KEY" in err and "--key-file" in err
    assert "settings-test-key" not in err  # the key itself is never printed
    assert not (tmp_path / "x.db").exists()


def test_the_key_is_read_from_a_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CALCX_KEY", raising=False)
    key_file = tmp_path / "server.key"
    key_file.write_text("k" * 31 + "\n")
    # the file's key is the one checked (31 characters: refused) ...
    assert main(["--key-file", str(key_file), "--port", "-1", "--db", str(tmp_path / "x.db")]) == 2
    assert "31 characters, fewer than 32" in capsys.readouterr().err
    # ... a good one is let through, to the bind of a port nobody can bind
    key_file.write_text("k" * 40 + "\n")
    with pytest.raises(OverflowError, match="port must be"):
        main(["--key-file", str(key_file), "--port", "-1", "--db", str(tmp_path / "x.db")])
    assert main(["--key-file", str(tmp_path / "missing.key")]) == 2
    assert "cannot read the server key from --key-file" in capsys.readouterr().err
