"""`calcx controller --runner k8s`: the runner's flags and the runner built from them."""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import replace

from calcx.contract.env import CALCX_AGENT_PROMPT, CALCX_AGENT_TOOL_ROUNDS, parse_agent_prompt, parse_tool_rounds
from calcx.controller.k8s_runner import K8sRunner, K8sRunnerConfig
from calcx.k8s.render import JobSettings

# the agent settings a Job gets from the controller's environment, each checked by its rule
AGENT_SETTINGS = ((CALCX_AGENT_TOOL_ROUNDS, parse_tool_rounds), (CALCX_AGENT_PROMPT, parse_agent_prompt))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ
    defaults = JobSettings()
    group = parser.add_argument_group("k8s runner")
    group.add_argument(
        "--namespace",
        default=env.get("CALCX_K8S_NAMESPACE", defaults.namespace),
        help="namespace of the agent Jobs (default $CALCX_K8S_NAMESPACE or calcx)",
    )
    group.add_argument(
        "--agent-image",
        default=env.get("CALCX_AGENT_IMAGE", defaults.image),
        help="agent image (default $CALCX_AGENT_IMAGE or calcx/agent:latest)",
    )
    group.add_argument(
        "--image-pull-policy",
        default=env.get("CALCX_K8S_IMAGE_PULL_POLICY", defaults.image_pull_policy),
        choices=["Always", "IfNotPresent", "Never"],
    )
    group.add_argument(
        "--kubeconfig",
        default=env.get("KUBECONFIG") or None,
        help="kubeconfig path (default: in-cluster config inside a pod, else $KUBECONFIG or ~/.kube/config)",
    )
    group.add_argument(
        "--max-jobs-per-s",
        type=float,
        default=float(env.get("CALCX_K8S_MAX_JOBS_PER_S", K8sRunnerConfig.max_jobs_per_s)),
        help=f"Job creation rate limit (token bucket, default {K8sRunnerConfig.max_jobs_per_s:g}/s)",
    )
    group.add_argument(
        "--job-ttl-s",
        type=int,
        default=int(env.get("CALCX_K8S_JOB_TTL_S", str(defaults.ttl_seconds_after_finished))),
        help=f"ttlSecondsAfterFinished of the Jobs (default {defaults.ttl_seconds_after_finished})",
    )


def build_runner(args: argparse.Namespace) -> K8sRunner:
    controller_id = getattr(args, "controller_id", None) or socket.gethostname()
    job = replace(
        JobSettings(),
        namespace=args.namespace,
        image=args.agent_image,
        image_pull_policy=args.image_pull_policy,
        ttl_seconds_after_finished=args.job_ttl_s,
        controller_id=controller_id,
    )
    try:
        settings: list[tuple[str, str]] = []
        for name, parse in AGENT_SETTINGS:
            value = os.environ.get(name, "").strip()
            if value:
                parse(value)  # refused here, not once per Job by its agent
                settings.append((name, value))
        config = K8sRunnerConfig(
            job=job, kubeconfig=args.kubeconfig, max_jobs_per_s=args.max_jobs_per_s, agent_settings=tuple(settings)
        )
    except ValueError as exc:
        raise SystemExit(f"calcx controller: {exc}") from exc
    return K8sRunner(config)
