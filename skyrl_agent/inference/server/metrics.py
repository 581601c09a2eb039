"""Prometheus metrics of the embedded server: engine counters read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from skyrl_agent.inference.server.engine import Engine

PREFIX = "skyrl_inference"


class _EngineCollector:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats()
        counters: dict[str, tuple[str, float]] = {
            "requests": ("Generation requests admitted", s.requests_total),
            "prompt_tokens": ("Prompt tokens processed", s.prompt_tokens_total),
            "generation_tokens": ("Tokens generated", s.generation_tokens_total),
            "prefix_cache_hit_tokens": ("Prompt tokens served from the prefix cache",
                                        s.cached_prompt_tokens_total),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        gauges: dict[str, tuple[str, float]] = {
            "batch_size": ("Sequences in the running batch", s.running),
            "queue_length": ("Requests waiting to be admitted", s.waiting),
            "paused": ("1 while generation is paused", int(s.paused)),
            "policy_version": ("Version of the served weights", s.policy_version),
            "tokens_per_second": ("Generated tokens per second over the last 10 s",
                                  s.tokens_per_second),
            "kv_cache_budget_bytes": ("KV cache budget", s.kv_budget_bytes),
            "kv_cache_used_bytes": ("KV cache held now (running batch + prefix cache)",
                                    s.kv_used_bytes),
            "kv_cache_peak_bytes": ("Most KV cache held after any engine step",
                                    s.kv_peak_bytes),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class ServerMetrics:
    """The registry behind /metrics: engine state plus HTTP responses by route and status."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.http_responses = Counter(f"{PREFIX}_http_responses", "HTTP responses",
                                      ["route", "status"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
