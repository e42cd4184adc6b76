"""One copy of every server default: `calcx server`'s flags and its --help take theirs from
calcx.server.settings.DEFAULTS, and start_server_thread passes settings through."""

from __future__ import annotations

from pathlib import Path

import pytest

from calcx.api.client import CalcxClient
from calcx.server.__main__ import build_parser, main
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
    "lease_s": "lease_s",
    "max_poll_s": "max_poll_s",
    "upstream_timeout_s": "upstream_timeout_s",
    "upstream_retries": "upstream_retries",
    "abort_retry_s": "abort_retry_s",
    "log_level": "log_level",
    "access_log": "access_log",
}


def test_every_flag_default_is_the_settings_default() -> None:
    args = build_parser().parse_args([])
    assert {dest: getattr(args, dest) for dest in FLAGS} == {dest: getattr(DEFAULTS, f) for dest, f in FLAGS.items()}


def test_help_shows_the_settings_defaults() -> None:
    text = " ".join(build_parser().format_help().split())
    for shown in (f"default {DEFAULTS.host}", f"default {DEFAULTS.port};", f"default {DEFAULTS.max_tokens_ceiling})",
                  f"default {DEFAULTS.lease_s:g})", f"default {DEFAULTS.max_poll_s:g})",
                  f"default {DEFAULTS.upstream_retries})", f"default {DEFAULTS.abort_retry_s:g})", f"default {DEFAULTS.max_body_bytes // 2**20} MiB"):
        assert shown in text


def test_poll_timeouts_are_cut_to_the_longest_poll() -> None:
    s = ServerSettings(max_poll_s=5.0)
    assert (s.poll_timeout(-1), s.poll_timeout(2), s.poll_timeout(60)) == (0.0, 2.0, 5.0)


def test_start_server_thread_passes_settings_through(tmp_path: Path) -> None:
    key = "settings-test-key-0123456789"
    thread = start_server_thread(str(tmp_path / "s.db"), key, lease_s=7.0)
    try:
        with CalcxClient(thread.url, key) as c:
            assert c.claim("ctl", max=1, timeout_s=0).lease_s == 7.0
    finally:
        thread.stop()


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_abort_retry_s_must_be_a_finite_number_not_below_zero(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--key", "settings-test-key-0123456789", "--abort-retry-s", bad]) == 2
    assert "--abort-retry-s must be a number of seconds >= 0" in capsys.readouterr().err
