"""Actors log through a sink actor without waiting for it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from craftrl.metrics import MetricsClient, MetricsSink, collect_statistics


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


@pytest.mark.ray
def test_a_slow_or_failing_component_leaves_only_its_own_statistics_out(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Component:
        def __init__(self, delay_s: float, statistics: dict):
            self.delay_s, self.statistics = delay_s, statistics

        def summary(self):
            time.sleep(self.delay_s)
            return self.statistics

        def broken(self):
            raise ValueError("the store is closed")

        def ready(self) -> bool:
            return True

    answering = Component.remote(0.0, {"replay/chunks": 3.0})
    busy = Component.remote(30.0, {"rollout/env_steps": 10.0})
    ray.get([answering.ready.remote(), busy.ready.remote()])  # started: the timeout below is for the calls alone
    collected, missing = collect_statistics({"rollout manager": busy.summary.remote(),
                                             "episode statistics": answering.broken.remote(),
                                             "replay store": answering.summary.remote()}, timeout_s=5.0)
    assert collected == {"replay/chunks": 3.0}
    assert missing["rollout manager"] == "no answer within 5 s"
    assert "the store is closed" in missing["episode statistics"] and set(missing) == {"rollout manager",
                                                                                      "episode statistics"}
    ray.kill(busy)
