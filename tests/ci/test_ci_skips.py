"""CI's skip check (.ci/skips.py): the skipped tests must be exactly the ones
.ci/expected-skips.txt names; one more, or one fewer, fails CI."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parents[2] / ".ci"
EXPECTED = CI / "expected-skips.txt"


def _skips_module():
    spec = importlib.util.spec_from_file_location("ci_skips", CI / "skips.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


skips = _skips_module()


def _report(tmp_path: Path, skipped: list[str], passed: int = 3) -> Path:
    cases = [f'<testcase classname="tests.x.test_ok" name="test_{i}"/>' for i in range(passed)]
    for test_id in skipped:
        module, name = test_id.split("::")
        cases.append(f'<testcase classname="tests.some.{module}" name="{name}"><skipped message="why"/></testcase>')
    report = tmp_path / "reports" / "r.xml"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(f'<testsuites><testsuite name="s">{"".join(cases)}</testsuite></testsuites>')
    return report.parent


def _named(env: dict[str, str]) -> list[str]:
    return sorted(skips.expected_skips(str(EXPECTED), env))


def test_every_expected_skip_has_a_reason() -> None:
    expected = skips.expected_skips(str(EXPECTED), {})
    assert expected and all(reason for reason in expected.values())


def test_the_named_skips_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("CALCX_GSM8K_FILE", raising=False)
    named = _named({})
    assert skips.main([str(_report(tmp_path, named)), str(EXPECTED)]) == 0
    assert f"3 passed, 0 failed, {len(named)} skipped ({len(named)} expected)" in capsys.readouterr().out


def test_a_new_skip_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("CALCX_GSM8K_FILE", raising=False)
    report = _report(tmp_path, _named({}) + ["test_new::test_that_stopped_running"])
    assert skips.main([str(report), str(EXPECTED)]) == 1
    assert "skipped but not named" in capsys.readouterr().out


def test_an_expected_skip_that_runs_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CALCX_GSM8K_FILE", raising=False)
    assert skips.main([str(_report(tmp_path, _named({})[1:])), str(EXPECTED)]) == 1


def test_a_conditional_skip_is_expected_only_while_its_variable_is_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALCX_GSM8K_FILE", "/data/gsm8k/train.jsonl")
    with_copy = _named({"CALCX_GSM8K_FILE": "x"})
    conditional = [line for line in EXPECTED.read_text().splitlines() if "unless=CALCX_GSM8K_FILE" in line]
    assert conditional and len(with_copy) == len(_named({})) - len(conditional)
    assert "test_data_import::test_the_real_gsm8k_train_file" not in with_copy
    assert skips.main([str(_report(tmp_path, with_copy)), str(EXPECTED)]) == 0
    assert skips.main([str(_report(tmp_path, _named({}))), str(EXPECTED)]) == 1
