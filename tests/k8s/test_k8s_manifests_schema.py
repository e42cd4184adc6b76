"""Every manifest passes the strict Kubernetes schema; a broken template does not; RBAC stays narrow;
`python -m calcx.k8s.build` writes a complete, valid directory quickly."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from calcx.image.recipes import AGENT, CONTROLLER
from calcx.k8s.render import JobSettings, RenderError, StaticSettings, render_attempt, render_static, templates_dir
from calcx.k8s.validate import ManifestInvalid, validate_all, validate_manifest

REPO = Path(__file__).resolve().parents[2]


def _attempt(directory: Path | None = None):  # type: ignore[no-untyped-def]
    return render_attempt(
        rollout_id="r",
        attempt_id="1",
        group_id="g",
        env={"QUESTION": "q", "RESULT": "1"},
        token="t",
        deadline_s=10,
        settings=JobSettings(),
        directory=directory,
    )


def test_all_rendered_manifests_pass_the_strict_schema() -> None:
    static = render_static(StaticSettings(), server_key="k" * 32)
    objects = {name: obj for name, (_, obj) in static.items()}
    attempt = _attempt()
    objects["job"] = attempt.job
    objects["secret"] = attempt.secret
    validate_all(objects)
    assert {o["kind"] for o in objects.values()} >= {
        "Job",
        "Secret",
        "Deployment",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Namespace",
        "NetworkPolicy",
    }


def _broken_copy(tmp_path: Path, original: str, broken: str) -> Path:
    copy = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy)
    text = (copy / "job.yaml.j2").read_text()
    assert original in text
    (copy / "job.yaml.j2").write_text(text.replace(original, broken))
    return copy


@pytest.mark.parametrize(
    ("original", "broken", "field"),
    [
        ("ttlSecondsAfterFinished:", "ttlSecondAfterFinished:", "ttlSecondAfterFinished"),
        ("automountServiceAccountToken:", "automountServiceAcountToken:", "automountServiceAcountToken"),
        ("imagePullPolicy:", "imagePulPolicy:", "imagePulPolicy"),
        ("emptyDir:", "emptyDirectory:", "emptyDirectory"),
        ("readOnlyRootFilesystem: true", 'readOnlyRootFilesystem: "yes"', "yes"),
    ],
)
def test_a_broken_copy_of_the_job_template_fails_validation(
    tmp_path: Path, original: str, broken: str, field: str
) -> None:
    attempt = _attempt(_broken_copy(tmp_path, original, broken))
    with pytest.raises(ManifestInvalid, match=field):
        validate_manifest(attempt.job, source="job.yaml.j2 copy")


@pytest.mark.parametrize(
    ("original", "broken", "what"),
    [
        ("restartPolicy: Never", "restartPolicyy: Never", "restartPolicy"),
        ("backoffLimit: 0", "backoffLimit: 3", "backoffLimit"),
        ("value: {{ env_value | q }}", "value: {{ env_value }}", "container env|not valid YAML"),
    ],
)
def test_the_renderer_refuses_a_template_that_drops_its_guarantees(
    tmp_path: Path, original: str, broken: str, what: str
) -> None:
    copy = _broken_copy(tmp_path, original, broken)
    with pytest.raises(RenderError, match=what):
        render_attempt(
            rollout_id="r",
            attempt_id="1",
            group_id="g",
            env={"QUESTION": "a: b", "RESULT": "1"},
            token="t",
            deadline_s=10,
            settings=JobSettings(),
            directory=copy,
        )


def test_misspelled_field_in_a_static_template_fails(tmp_path: Path) -> None:
    copy = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy)
    path = copy / "controller-deployment.yaml.j2"
    path.write_text(path.read_text().replace("serviceAccountName:", "serviceAcountName:"))
    static = render_static(StaticSettings(), directory=copy)
    with pytest.raises(ManifestInvalid, match="serviceAcountName"):
        validate_all({name: obj for name, (_, obj) in static.items()})


def test_unknown_kubernetes_version_is_a_clear_error() -> None:
    with pytest.raises(ManifestInvalid, match="does not support version"):
        validate_manifest(_attempt().job, version="9.99")


def test_rbac_is_namespaced_and_limited_to_what_the_runner_uses() -> None:
    static = render_static(StaticSettings(namespace="team-a"))
    role = static["role.yaml"][1]
    binding = static["rolebinding.yaml"][1]
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "team-a"
    granted = {
        (g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert granted == {
        ("batch", "jobs"): {"create", "get", "list", "watch", "patch", "delete"},
        ("", "pods"): {"list", "watch"},
        ("", "pods/log"): {"get"},
        # create only: no get, list or watch (the server key's Secret is unreadable), no patch (its
        # answer carries the Secret's data), no delete (a Secret goes with the Job that owns it)
        ("", "secrets"): {"create"},
    }
    all_verbs = set().union(*granted.values())
    assert "*" not in all_verbs and "escalate" not in all_verbs and "bind" not in all_verbs
    assert not any("*" in rule["resources"] or "*" in rule["apiGroups"] for rule in role["rules"])
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "calcx-controller", "namespace": "team-a"}]
    deployment = static["controller-deployment.yaml"][1]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "calcx-controller"


def test_agent_pods_get_no_api_credentials_and_run_unprivileged() -> None:
    pod = _attempt().job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_server_key_secret_holds_the_key_and_kustomization_switches_to_it() -> None:
    hostile_key = 'k"ey: with\nnewline-0123456789-abcdefghij'
    with_key = render_static(StaticSettings(), server_key=hostile_key)
    assert with_key["server-key-secret.yaml"][1]["stringData"] == {"key": hostile_key}
    assert "secretGenerator" not in with_key["kustomization.yaml"][1]
    without = render_static(StaticSettings())
    assert "server-key-secret.yaml" not in without
    assert without["kustomization.yaml"][1]["secretGenerator"][0]["envs"] == ["server-key.env"]
    with pytest.raises(RenderError, match="server key is empty"):
        render_static(StaticSettings(), server_key="  ")
    with pytest.raises(RenderError, match="fewer than 32"):
        render_static(StaticSettings(), server_key="k" * 31)


def test_build_cli_writes_a_valid_directory(tmp_path: Path) -> None:
    key_file = tmp_path / "key.txt"
    key_file.write_text("0123456789abcdef0123456789abcdef\n")
    out = tmp_path / "manifests"
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "calcx.k8s.build",
            "--out",
            str(out),
            "--namespace",
            "ml",
            "--agent-image",
            "registry.local/calcx/agent:1.2",
            "--server-key-file",
            str(key_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "src/python"), "PATH": "/usr/bin:/bin"},
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    # ~2 s here; the ceiling is below the 60 s subprocess timeout only to report a slow build clearly
    assert elapsed < 45, f"build took {elapsed:.1f} s"
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        obj = yaml.safe_load((out / resource).read_text())
        validate_manifest(obj, source=resource)
        assert obj["metadata"].get("namespace", obj["metadata"]["name"]) == "ml"  # a Namespace is named so
    assert "server-key-secret.yaml" in kustomization["resources"]
    assert (out / "server-key-secret.yaml").stat().st_mode & 0o777 == 0o600  # it holds the server key
    example = yaml.safe_load((out / "examples/agent-job.yaml").read_text())
    assert example["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/calcx/agent:1.2"


def test_build_cli_reports_an_unreadable_key_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "calcx.k8s.build",
            "--out",
            str(tmp_path / "o"),
            "--server-key-file",
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "src/python"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2 and "--server-key-file" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_the_namespace_enforces_the_restricted_pod_security_standard() -> None:
    namespace = render_static(StaticSettings(namespace="team-a"))["namespace.yaml"][1]
    assert namespace["metadata"]["name"] == "team-a"
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # what `restricted` demands of every pod, the agent's and the controller's have
    for pod in (
        _attempt().job["spec"]["template"]["spec"],
        render_static(StaticSettings())["controller-deployment.yaml"][1]["spec"]["template"]["spec"],
    ):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize(
    ("server_url", "peer", "port"),
    [
        (
            "http://calcx-server:8000",
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "calcx-server"}}},
            8000,
        ),
        ("http://172.18.0.1:8123", {"ipBlock": {"cidr": "172.18.0.1/32"}}, 8123),
        ("https://calcx.example", {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "calcx-server"}}}, 443),
    ],
)
def test_agent_pods_may_reach_only_the_server_and_dns(server_url: str, peer: dict, port: int) -> None:
    policy = render_static(StaticSettings(server_url=server_url))["networkpolicy.yaml"][1]
    spec = policy["spec"]
    pod_labels = _attempt().job["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()  # it selects the agent pods
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    server, dns = spec["egress"]
    assert server == {"to": [peer], "ports": [{"protocol": "TCP", "port": port}]}
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert dns["to"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    with pytest.raises(RenderError, match="must be http"):
        render_static(StaticSettings(server_url="calcx-server:8000"))


def test_pods_run_as_the_user_their_image_is_built_for() -> None:
    """The Deployment runs the controller image and each Job the agent image as the numeric user
    that image's recipe writes into its passwd (calcx.image.recipes), user and group alike."""
    static = render_static(StaticSettings())
    controller = static["controller-deployment.yaml"][1]["spec"]["template"]["spec"]["securityContext"]
    assert (controller["runAsUser"], controller["runAsGroup"]) == (CONTROLLER.uid, CONTROLLER.uid)
    job = _attempt().job["spec"]["template"]["spec"]["securityContext"]
    assert (job["runAsUser"], job["runAsGroup"]) == (AGENT.uid, AGENT.uid)
