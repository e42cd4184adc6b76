"""The KubeRay RayCluster of a trainer on several GPU nodes: it renders, it passes calcx's
RayCluster schema and the strict pod schema, its shape follows the render parameters, it reaches
the server the agents use with the key from the existing Secret, and planted errors fail."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from calcx.k8s.build import build
from calcx.k8s.ray import RAY_CLUSTER_FILE, RAY_VERSION, RaySettings, render_ray_cluster
from calcx.k8s.render import TEMPLATES_ENV, RenderError, StaticSettings, render_static, templates_dir
from calcx.k8s.validate import ManifestInvalid, validate_manifest

REPO = Path(__file__).resolve().parents[2]
KEY = "k" * 40


def cluster(ray: RaySettings | None = None, static: StaticSettings | None = None) -> dict[str, Any]:
    return render_ray_cluster(ray or RaySettings(), static or StaticSettings())[1]


def pods(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = obj["spec"]
    return {
        "head": spec["headGroupSpec"]["template"]["spec"],
        "worker": spec["workerGroupSpecs"][0]["template"]["spec"],
    }


def test_the_default_cluster_is_a_head_without_gpus_and_one_worker_with_one() -> None:
    obj = cluster()
    validate_manifest(obj, source="raycluster")
    assert (obj["apiVersion"], obj["kind"], obj["spec"]["rayVersion"]) == ("ray.io/v1", "RayCluster", RAY_VERSION)
    group = obj["spec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 1)
    limits = {node: pod["containers"][0]["resources"]["limits"] for node, pod in pods(obj).items()}
    assert "nvidia.com/gpu" not in limits["head"] and limits["worker"]["nvidia.com/gpu"] == 1
    assert obj["spec"]["enableInTreeAutoscaling"] is False


def test_nodes_and_gpus_are_render_parameters() -> None:
    obj = cluster(
        RaySettings(workers=4, gpus_per_worker=8, worker_cpu="32", worker_memory="512Gi"),
        StaticSettings(namespace="team-a"),
    )
    validate_manifest(obj, source="raycluster")
    group = obj["spec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (4, 4, 4)
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "32",
        "memory": "512Gi",
        "nvidia.com/gpu": 8,
    }
    assert obj["metadata"]["namespace"] == "team-a"


@pytest.mark.parametrize("field, value", [("workers", 0), ("gpus_per_worker", 0), ("workers", True)])
def test_a_cluster_without_workers_or_gpus_is_refused(field: str, value: object) -> None:
    with pytest.raises(RenderError, match=field):
        render_ray_cluster(RaySettings(**{field: value}), StaticSettings())  # type: ignore[arg-type]


def test_every_node_reaches_the_agents_server_with_the_key_from_its_secret() -> None:
    static = StaticSettings(server_url="http://calcx-server.calcx.svc:8000", server_key_secret="our-key")
    controller = render_static(static)["controller-deployment.yaml"][1]
    controller_env = {e["name"]: e for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    for node, pod in pods(cluster(static=static)).items():
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["CALCX_SERVER"] == controller_env["CALCX_SERVER"], node  # the URL agents are given
        assert (
            env["CALCX_KEY"]
            == controller_env["CALCX_KEY"]
            == {"name": "CALCX_KEY", "valueFrom": {"secretKeyRef": {"name": "our-key", "key": "key"}}}
        ), node
        assert "value" not in env["CALCX_KEY"]


def test_no_pod_gets_a_token_and_every_pod_passes_the_restricted_standard() -> None:
    for node, pod in pods(cluster()).items():
        assert pod["automountServiceAccountToken"] is False, node
        assert "serviceAccountName" not in pod, node  # never the controller's account
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        context = pod["containers"][0]["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
        assert all(set(v) <= {"name", "emptyDir"} for v in pod["volumes"]), node  # no hostPath, no projected token


def test_the_cluster_runs_the_trainers_ray() -> None:
    for name in ("gpu-requirements.txt", "trainer-requirements.txt"):
        pins = re.findall(r"^ray==(\S+)$", (REPO / "3rdparty/python" / name).read_text(), re.M)
        assert pins == [RAY_VERSION], name
    assert RAY_VERSION in RaySettings().image


def _without(obj: dict[str, Any], *path: Any) -> dict[str, Any]:
    broken = copy.deepcopy(obj)
    target = broken
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return broken


def _set(obj: dict[str, Any], value: Any, *path: Any) -> dict[str, Any]:
    broken = copy.deepcopy(obj)
    target = broken
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return broken


GROUP = ("spec", "workerGroupSpecs", 0)
WORKER_CONTAINER = (*GROUP, "template", "spec", "containers", 0)
HEAD_POD = ("spec", "headGroupSpec", "template", "spec")


@pytest.mark.parametrize(
    "planted, message",
    [
        (lambda o: _without(o, *GROUP, "replicas"), "'replicas' is a required property"),
        (lambda o: _without(o, *GROUP, "maxReplicas"), "'maxReplicas' is a required property"),
        (lambda o: _set(o, 2, *GROUP, "minReplicas"), "minReplicas 2 <= replicas 1"),
        (lambda o: _set(o, "2", *GROUP, "replicas"), "is not of type 'integer'"),
        (lambda o: _set(o, [], "spec", "workerGroupSpecs"), "should be non-empty"),
        (lambda o: _set(o, {"name": "CALCX_KEY", "value": KEY}, *WORKER_CONTAINER, "env", 1), "never a plain value"),
        (
            lambda o: _set(
                o,
                {"name": "CALCX_KEY", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "key"}}},
                *WORKER_CONTAINER,
                "env",
                1,
            ),
            "'secretKeyRef' is a required property",
        ),
        (lambda o: _set(o, True, *HEAD_POD, "automountServiceAccountToken"), "False was expected"),
        (lambda o: _without(o, *WORKER_CONTAINER, "resources", "limits"), "'limits' is a required property"),
        (
            lambda o: _set(o, o["spec"]["workerGroupSpecs"], "spec", "workerGroupSpec"),
            "'workerGroupSpec' was unexpected",
        ),
        (lambda o: _set(o, 1, *GROUP, "replica"), "'replica' was unexpected"),
        (lambda o: _set(o, "ray.io/v1alpha1", "apiVersion"), "Couldn't find schema for kind RayCluster"),
        (lambda o: _set(o, "Never", *WORKER_CONTAINER, "imagePulPolicy"), "'imagePulPolicy' was unexpected"),
        (lambda o: _set(o, {}, *HEAD_POD, "securityContextt"), "PodTemplate .*'securityContextt' was unexpected"),
    ],
)
def test_a_planted_error_fails_validation(planted: Any, message: str) -> None:
    with pytest.raises(ManifestInvalid, match=message) as err:
        validate_manifest(planted(cluster()), source="raycluster")
    assert KEY not in str(err.value)  # a key planted as a value is never printed


def test_the_renderer_refuses_a_template_that_puts_the_key_in_plain_env(tmp_path: Path) -> None:
    copy_dir = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy_dir)
    template = copy_dir / "raycluster.yaml.j2"
    text = template.read_text()
    key_ref = '''- name: "CALCX_KEY"
          valueFrom:
            secretKeyRef:
              name: {{ server_key_secret | q }}
              key: "key"'''
    assert key_ref in text
    template.write_text(text.replace(key_ref, '- name: "CALCX_KEY"\n          value: {{ server_key_secret | q }}'))
    with pytest.raises(RenderError, match="env"):
        render_ray_cluster(RaySettings(), StaticSettings(), directory=copy_dir)


def test_the_build_writes_the_cluster_apart_from_the_kustomization(tmp_path: Path) -> None:
    written = build(tmp_path, StaticSettings(), KEY, "1.31", RaySettings(workers=2, gpus_per_worker=8))
    assert tmp_path / RAY_CLUSTER_FILE in written
    obj = yaml.safe_load((tmp_path / RAY_CLUSTER_FILE).read_text())
    validate_manifest(obj, source=RAY_CLUSTER_FILE)
    assert obj["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert KEY not in (tmp_path / RAY_CLUSTER_FILE).read_text()
    # `kubectl apply -k` must not need KubeRay's CRDs
    assert RAY_CLUSTER_FILE not in yaml.safe_load((tmp_path / "kustomization.yaml").read_text())["resources"]


def test_the_build_writes_nothing_when_the_cluster_is_invalid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy_dir = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy_dir)
    template = copy_dir / "raycluster.yaml.j2"
    template.write_text(template.read_text().replace("enableInTreeAutoscaling:", "enableInTreeAutoscalingg:"))
    monkeypatch.setenv(TEMPLATES_ENV, str(copy_dir))
    out = tmp_path / "out"
    with pytest.raises(ManifestInvalid, match="'enableInTreeAutoscalingg' was unexpected"):
        build(out, StaticSettings(), KEY, "1.31")
    assert not out.exists()
