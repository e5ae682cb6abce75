"""The server's Prometheus metrics, in a registry of their own (several servers in one process, as the tests
start them, do not collide): queue depth, active slots, time to first token, inter-token latency, tokens in and
out, speculative acceptance length, requests by endpoint and status."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("lucegen_queue_depth", "requests waiting for a slot", registry=r)
        self.active_slots = Gauge("lucegen_active_slots", "slots generating for a request", registry=r)
        self.ttft = Histogram("lucegen_time_to_first_token_seconds", "request arrival to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("lucegen_inter_token_latency_seconds", "time between a request's tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("lucegen_prompt_tokens", "prompt tokens received", registry=r)
        self.cached_tokens = Counter("lucegen_prefix_cache_hit_tokens", "prompt tokens resumed from the prefix "
                                     "cache instead of prefilled", registry=r)
        self.generated_tokens = Counter("lucegen_generation_tokens", "tokens generated", registry=r)
        self.acceptance = Histogram("lucegen_acceptance_length", "tokens emitted per speculative step",
                                    buckets=(1, 1.5, 2, 3, 4, 5, 6, 8, 10, 12, 16), registry=r)
        self.requests = Counter("lucegen_requests", "requests answered", ("endpoint", "status"), registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
