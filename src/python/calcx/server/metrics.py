"""Prometheus metrics of one server app (its own registry, so several apps can share a process)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from calcx.api.models import ROLLOUT_STATES
from calcx.server.replicas import ReplicaState


class _RolloutStateCollector(Collector):
    """Counts rollouts by state from the store at scrape time (the store is the truth)."""

    def __init__(self, count_by_state: Callable[[], dict[str, int]]) -> None:
        self._count = count_by_state

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("calcx_rollouts", "Rollouts by the state of their latest attempt", labels=["state"])
        try:
            counts = self._count()
        except Exception:  # store not open (starting or stopped): report nothing rather than fail the scrape
            counts = None
        if counts is not None:
            for state in ROLLOUT_STATES:
                family.add_metric([state], counts.get(state, 0))
        yield family


class _ReplicaCollector(Collector):
    """The registered model endpoints as the gateway sees them, at scrape time."""

    def __init__(self, states: Callable[[], Iterable[ReplicaState]]) -> None:
        self._states = states

    def collect(self) -> Iterable[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "calcx_gateway_replica_up",
            "1 while a model endpoint may take new rollouts, 0 from a failure until it answers",
            labels=["endpoint"],
        )
        in_flight = GaugeMetricFamily(
            "calcx_gateway_replica_in_flight", "Upstream tries in flight per model endpoint", labels=["endpoint"]
        )
        rollouts = GaugeMetricFamily(
            "calcx_gateway_replica_rollouts",
            "Rollouts whose calls go to each model endpoint (until their attempt ends)",
            labels=["endpoint"],
        )
        for state in self._states():
            up.add_metric([state.endpoint], 1 if state.up else 0)
            in_flight.add_metric([state.endpoint], state.in_flight)
            rollouts.add_metric([state.endpoint], state.rollouts)
        yield from (up, in_flight, rollouts)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rollouts_created = Counter(
            "calcx_rollouts_created", "Rollouts created (idempotent repeats not counted)", registry=self.registry
        )
        self.claims = Counter("calcx_claims", "Attempts handed to controllers", registry=self.registry)
        self.finished = Counter(
            "calcx_attempts_finished",
            "Attempts finished, by state and reason",
            ["state", "reason"],
            registry=self.registry,
        )
        self.retries = Counter("calcx_retries", "New attempts queued after a failure", registry=self.registry)
        self.stated_calls_read = Counter(
            "calcx_gateway_stated_calls_read",
            "Answers whose tool calls vLLM's parser left in the text and the gateway read "
            "(the template's doubled-brace form, calls beside a block that is none)",
            registry=self.registry,
        )
        self.events = Counter("calcx_events", "Events received, by type", ["event_type"], registry=self.registry)
        self.pruned = Counter(
            "calcx_rollouts_pruned", "Terminal rollouts deleted by retention (--retain-s)", registry=self.registry
        )
        self.gateway_calls = Counter(
            "calcx_gateway_calls",
            "Gateway chat completions, by the status returned to the agent",
            ["status"],
            registry=self.registry,
        )
        self.gateway_latency = Histogram(
            "calcx_gateway_latency_seconds",
            "Time from gateway request to answer, including upstream retries",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "calcx_gateway_upstream_errors",
            "Failed upstream tries, by kind (status code, timeout, connect, abort: an answer the model server aborted)",
            ["kind"],
            registry=self.registry,
        )
        self.replica_calls = Counter(
            "calcx_gateway_replica_calls",
            "Upstream tries sent to each model endpoint (answered or not)",
            ["endpoint"],
            registry=self.registry,
        )
        self.http_errors = Counter(
            "calcx_http_errors", "API error answers, by status and code", ["status", "code"], registry=self.registry
        )

    def watch_store(self, count_by_state: Callable[[], dict[str, int]]) -> None:
        self.registry.register(_RolloutStateCollector(count_by_state))

    def watch_replicas(self, states: Callable[[], Iterable[ReplicaState]]) -> None:
        self.registry.register(_ReplicaCollector(states))

    def render(self) -> bytes:
        return generate_latest(self.registry)
