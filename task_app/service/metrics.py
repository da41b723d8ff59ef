"""`GET /metrics`: this process's counters, histograms and gauges in the Prometheus text format.

    counters    taskapp_rollouts_started_total, taskapp_rollouts_finished_total{status, stop_reason},
                taskapp_decisions_total, taskapp_unusable_answers_total,
                taskapp_rollout_errors_total{class} (metrics.details.error.class: model_unreachable, ...),
                taskapp_callbacks_total{outcome}
    histograms  taskapp_model_call_seconds (every answered model call), taskapp_rollout_seconds
    read when scraped, from the parts that keep them:
                taskapp_rollouts_in_flight, taskapp_rollouts_queued, taskapp_env_sessions_live,
                taskapp_openenv_websockets (gauges); taskapp_world_cache_hits_total,
                taskapp_world_cache_misses_total, taskapp_trace_writes_total,
                taskapp_trace_storage_failures_total, taskapp_run_store_failures_total (counters);
                taskapp_process_info{instance} (1), the process's id in the fleet (rollout/fleet.py)

Per process: each Modal container has its own, and a scrape of the app's URL reaches one of them
(docs/fleet.md, "Operating it", says how to read them). One `CollectorRegistry` per app, never the global one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..game import WorldFactory
from ..rollout.control import RunStatus
from ..rollout.registry import RunRegistry
from ..rollout.result import DecisionRecord, RolloutResult
from ..sessions.runtime import SessionServices
from ..tracing.recording import TraceRecorder

MODEL_CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ROLLOUT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 150.0, 300.0, 600.0, 1800.0, 3600.0)


@dataclass(frozen=True, slots=True)
class Sources:
    """The parts of the app whose own counts /metrics reads at scrape time."""

    instance: str
    registry: RunRegistry
    worlds: WorldFactory
    recorder: TraceRecorder
    sessions: SessionServices


class _Components(Collector):
    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        parts = self.sources
        info = GaugeMetricFamily(
            "taskapp_process_info", "this process; instance is its id in the fleet", labels=["instance"]
        )
        info.add_metric([parts.instance], 1)
        yield info
        gauges = (
            ("taskapp_rollouts_in_flight", "rollouts running in this process", parts.registry.active),
            ("taskapp_rollouts_queued", "accepted rollouts waiting for a slot here", parts.registry.queued),
            ("taskapp_env_sessions_live", "env sessions held live here", len(parts.sessions.envs.live)),
            ("taskapp_openenv_websockets", "open OpenEnv WebSocket sessions", parts.sessions.websockets.active),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        trace = parts.recorder.health()
        counters = (
            ("taskapp_world_cache_hits", "worlds restored from the cache", parts.worlds.hits),
            ("taskapp_world_cache_misses", "worlds generated", parts.worlds.misses),
            ("taskapp_trace_writes", "rollouts written to the trace store", trace.get("written", 0)),
            ("taskapp_trace_storage_failures", "trace writes that failed", trace.get("failures", 0)),
            ("taskapp_run_store_failures", "run ends the state store did not take", parts.registry.store_failures),
        )
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)


class Metrics:
    def __init__(self, sources: Sources) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_Components(sources))
        self.started = Counter("taskapp_rollouts_started", "rollouts started", registry=self.registry)
        self.finished = Counter(
            "taskapp_rollouts_finished",
            "rollouts finished",
            ["status", "stop_reason"],
            registry=self.registry,
        )
        self.decisions = Counter("taskapp_decisions", "decisions made", registry=self.registry)
        self.unusable = Counter("taskapp_unusable_answers", "model answers with nothing to run", registry=self.registry)
        self.errors = Counter(
            "taskapp_rollout_errors",
            "rollouts that did not complete normally, by error class",
            ["class"],
            registry=self.registry,
        )
        self.callbacks = Counter("taskapp_callbacks", "callback deliveries", ["outcome"], registry=self.registry)
        self.model_calls = Histogram(
            "taskapp_model_call_seconds",
            "latency of answered model calls",
            buckets=MODEL_CALL_BUCKETS,
            registry=self.registry,
        )
        self.rollout_seconds = Histogram(
            "taskapp_rollout_seconds", "rollout durations", buckets=ROLLOUT_BUCKETS, registry=self.registry
        )

    def decision(self, record: DecisionRecord) -> None:
        self.decisions.inc()
        decision = record.decision
        if decision is None:
            return
        if not decision.usable:
            self.unusable.inc()
        call = decision.lm_call
        if call is not None and call.error is None:
            self.model_calls.observe(call.latency_ms / 1000)

    def rollout_finished(self, result: RolloutResult | None, status: RunStatus) -> None:
        stop_reason = result.stop_reason.value if result is not None else "not_started"
        self.finished.labels(status.value, stop_reason).inc()
        if result is None:
            return
        failure = result.failure()
        if failure is not None:
            self.errors.labels(failure["class"]).inc()
        if result.finished_at is not None:
            self.rollout_seconds.observe((result.finished_at - result.started_at).total_seconds())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
