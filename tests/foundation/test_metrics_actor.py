"""Actors log through a sink actor without waiting for it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from craftrl.metrics import MetricsClient, MetricsSink


@pytest.mark.ray
def test_actor_logging_is_fire_and_forget_and_lands_in_metrics_jsonl(ray_session, tmp_path: Path):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class SlowSink(MetricsSink):
        def log(self, metrics, step, wall_time):
            time.sleep(0.05)  # a slow disk or network sink
            super().log(metrics, step, wall_time)

    sink = SlowSink.remote(str(tmp_path))

    @ray.remote(num_cpus=0)
    class Producer:
        def __init__(self, sink_handle):
            self.client = MetricsClient(sink_handle, max_in_flight=1000)

        def produce(self, n):
            started = time.perf_counter()
            for step in range(n):
                self.client.log({"value": step}, step=step)
            return time.perf_counter() - started

        def flush(self):
            return self.client.flush()

    producer = Producer.remote(sink)
    elapsed = ray.get(producer.produce.remote(40))
    assert elapsed < 40 * 0.05 / 2, f"logging blocked the producer for {elapsed:.2f}s"
    assert ray.get(producer.flush.remote()) == 0
    ray.get(sink.close.remote())
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(40))


@pytest.mark.ray
def test_client_drops_and_counts_when_too_many_calls_are_in_flight(ray_session, tmp_path: Path):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class StuckSink:
        def log(self, metrics, step, wall_time):
            time.sleep(1.0)

    client = MetricsClient(StuckSink.remote(), max_in_flight=3)
    for step in range(10):
        client.log({"v": step}, step)
    assert client.dropped == 7
