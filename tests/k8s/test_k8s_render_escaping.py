"""Hostile dataset text cannot change the rendered manifests: values come back exactly, the
structure stays the same, and the result passes the strict Kubernetes schema."""

from __future__ import annotations

import json
from copy import deepcopy
from typing import Any

import pytest
import yaml

from calcx.contract.env import MAX_ENV_BYTES
from calcx.k8s.escaping import dns_label, label_value, yaml_quote
from calcx.k8s.render import SECRET_KEY_NAME, JobSettings, RenderError, render_attempt
from calcx.k8s.validate import validate_manifest

HOSTILE = [
    "He said \"2+3\"; she said '4'",
    "line one\nline two\r\nline three\ttab",
    "answer: 5\nkind: Secret\nmetadata: {name: pwned}",
    "{{ 7*7 }} {% for x in y %} {# comment #}",
    "---\napiVersion: v1\nkind: Pod\n---",
    "# not a comment\n#neither",
    "  leading and trailing spaces  ",
    "- a list item\n- another",
    "&anchor *alias !!python/object:os.system ? : |",
    "\\n is not a newline, \\u0041 is not A, \\\\ stays",
    "Unicode: π ≈ 3.14, ÷ × √, 中文, emoji 😀🧮, RTL \u202e text, zero\u200bwidth",
    "controls \x01\x07\x1b[31m\x7f\x85\u2028\u2029\ufeff end",
    "",
    "null",
    "yes",
    "0x1F",
    "1e3",
    "~",
    "@at `backtick` %percent",
    "x" * 100_000,
    "ü" * 40_000,
]


def _render(question: str, result: str = "5", **overrides: Any) -> Any:
    return render_attempt(
        rollout_id=overrides.pop("rollout_id", "r-1"),
        attempt_id=overrides.pop("attempt_id", "1"),
        group_id=overrides.pop("group_id", "g"),
        env={
            "QUESTION": question,
            "RESULT": result,
            "AGL_OPENAI_BASE_URL": "http://s/v1",
            "AGL_EVENT_URL": "http://s/e",
        },
        token=overrides.pop("token", "calcx-at.r-1.1.00ff"),
        deadline_s=overrides.pop("deadline_s", 300),
        settings=JobSettings(**overrides),
    )


def _shape(obj: Any) -> Any:
    """The structure of a manifest: keys and list lengths, without leaf values."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_shape(v) for v in obj]
    return type(obj).__name__


# Two independent YAML readers of the rendered text: PyYAML's pure-Python loader and libyaml's.
# What the API server gets is the renderer's own parse (`rendered.job`); what kubectl or the
# manifests archive would give it is the text: both must say the same thing.
LOADERS = [yaml.SafeLoader] + ([yaml.CSafeLoader] if getattr(yaml, "__with_libyaml__", False) else [])
REFERENCE_QUESTION, REFERENCE_RESULT = "What is 2+3?", "5"
ENV_NAMES = ["QUESTION", "RESULT", "AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY"]


def _container_env(job: dict[str, Any]) -> list[dict[str, Any]]:
    return job["spec"]["template"]["spec"]["containers"][0]["env"]


def _with_env_values(job: dict[str, Any], question: str, result: str) -> dict[str, Any]:
    """A copy of `job` with the QUESTION and RESULT values replaced."""
    copy = deepcopy(job)
    for entry in _container_env(copy):
        if entry["name"] == "QUESTION":
            entry["value"] = question
        elif entry["name"] == "RESULT":
            entry["value"] = result
    return copy


@pytest.mark.parametrize("loader", LOADERS, ids=lambda loader: loader.__name__)
@pytest.mark.parametrize("question", HOSTILE, ids=lambda q: repr(q[:30]))
def test_hostile_question_reaches_the_container_env_exactly_and_keeps_structure(question: str, loader: Any) -> None:
    reference = _render(REFERENCE_QUESTION, result=REFERENCE_RESULT)
    rendered = _render(question, result=question)
    ref_docs = list(yaml.load_all(reference.job_yaml, Loader=loader))
    docs = list(yaml.load_all(rendered.job_yaml, Loader=loader))

    # Structure: the same number of documents, kinds and keys as a plain question gives.
    assert len(ref_docs) == 1 and len(docs) == len(ref_docs), [
        d.get("kind") if isinstance(d, dict) else d for d in docs
    ]
    assert [(d["apiVersion"], d["kind"]) for d in docs] == [("batch/v1", "Job")]
    assert _shape(docs[0]) == _shape(ref_docs[0])
    env = _container_env(docs[0])
    assert [e["name"] for e in env] == ENV_NAMES
    assert [sorted(e) for e in env] == [["name", "value"]] * 4 + [["name", "valueFrom"]]
    # Nothing but the two values differs from the reference Job: no key, label, name or
    # setting was added, dropped or changed by the hostile text.
    assert _with_env_values(docs[0], REFERENCE_QUESTION, REFERENCE_RESULT) == ref_docs[0]
    assert list(yaml.load_all(rendered.secret_yaml, Loader=loader)) == list(
        yaml.load_all(reference.secret_yaml, Loader=loader)
    )

    # Values: the container env carries the exact text, byte for byte.
    values: dict[str, Any] = {e["name"]: e.get("value") for e in env}
    for name in ("QUESTION", "RESULT"):
        assert type(values[name]) is str, (name, values[name])
        assert values[name].encode("utf-8") == question.encode("utf-8"), name
    assert values["AGL_OPENAI_BASE_URL"] == "http://s/v1" and values["AGL_EVENT_URL"] == "http://s/e"

    # What the controller sends to the API server (the renderer's own parse, as JSON) says the same.
    assert rendered.job == docs[0]
    sent = json.loads(json.dumps(rendered.job, ensure_ascii=True))
    assert {e["name"]: e.get("value") for e in _container_env(sent)} == values
    validate_manifest(rendered.job)


@pytest.mark.parametrize("text", HOSTILE[:12], ids=lambda q: repr(q[:30]))
def test_hostile_ids_and_token_stay_in_annotations_and_secret(text: str) -> None:
    rendered = _render("q", rollout_id=text or "r", group_id=text, token=text or "t")
    meta = rendered.job["metadata"]
    assert meta["annotations"]["calcx.dev/rollout-id"] == (text or "r")
    assert meta["annotations"]["calcx.dev/group-id"] == text
    assert rendered.secret["stringData"] == {SECRET_KEY_NAME: text or "t"}
    assert _shape(rendered.secret) == _shape(_render("q").secret)
    validate_manifest(rendered.job)  # names and label values were sanitised to valid syntax
    validate_manifest(rendered.secret)


def test_yaml_quote_is_read_back_exactly_by_yaml_and_json() -> None:
    every_bmp_sample = (
        "".join(chr(c) for c in range(1, 0x3000, 7) if not 0xD800 <= c <= 0xDFFF) + "\U0001f600\U000e0001"
    )
    quoted = yaml_quote(every_bmp_sample)
    assert yaml.safe_load(f"k: {quoted}")["k"] == every_bmp_sample
    assert json.loads(quoted) == every_bmp_sample


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ("2+3\x00", "NUL"),
        ("bad \ud800 surrogate", "not valid Unicode"),
        ("x" * MAX_ENV_BYTES, "Linux limits one variable"),
    ],
)
def test_text_no_environment_can_hold_is_refused_clearly(question: str, message: str) -> None:
    with pytest.raises(RenderError, match=message):
        _render(question)


def test_numbers_cannot_smuggle_text() -> None:
    with pytest.raises(RenderError, match="non-negative int"):
        _render("q", ttl_seconds_after_finished="600\nhostPID: true")  # type: ignore[arg-type]
    with pytest.raises(RenderError, match="positive finite"):
        _render("q", deadline_s=float("nan"))


def test_deadline_and_ttl_land_in_the_job() -> None:
    job = _render("q", deadline_s=12.2, ttl_seconds_after_finished=77).job
    assert job["spec"]["activeDeadlineSeconds"] == 13
    assert job["spec"]["ttlSecondsAfterFinished"] == 77
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_labels_are_valid_and_distinct_for_distinct_ids() -> None:
    ids = ["r-1", "R 1", "r/1", "r_1", "a" * 64, "a" * 65, "-x-", "ünï", ""]
    values = [label_value(i) for i in ids]
    assert len(set(values)) == len(ids)
    for v in values:
        validate_manifest({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "labels": {"k": v}}})
    names = {dns_label("calcx", i, "a1") for i in ids}
    assert len(names) == len(ids) and all(len(n) <= 63 for n in names)
    assert label_value("simple-id_1.0") == "simple-id_1.0"


def test_agl_key_in_the_env_is_replaced_by_the_secret_ref() -> None:
    rendered = render_attempt(
        rollout_id="r",
        attempt_id="2",
        group_id=None,
        env={"QUESTION": "q", "AGL_KEY": "leak"},
        token="calcx-at.r.2.ab",
        deadline_s=5,
        settings=JobSettings(),
    )
    env = rendered.job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "AGL_KEY"] == [
        {"name": "AGL_KEY", "valueFrom": {"secretKeyRef": {"name": rendered.secret_name, "key": SECRET_KEY_NAME}}}
    ]
    assert "leak" not in rendered.job_yaml
    assert "calcx.dev/group-id" not in rendered.job["metadata"]["labels"]


@pytest.mark.parametrize("code", [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)], ids=lambda c: f"U+{c:04X}")
def test_every_c0_and_c1_control_is_written_as_an_escape(code: int) -> None:
    """Every control character, the whole C1 range 0x80-0x9F included, leaves the quoted scalar as
    a `\\uXXXX` escape and reads back exactly."""
    text = f"a{chr(code)}b"
    quoted = yaml_quote(text)
    assert chr(code) not in quoted
    assert yaml.safe_load(f"v: {quoted}\n") == {"v": text}
