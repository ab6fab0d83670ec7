from gateway.routing.stats import LatencyStats, find_slow
from gateway.settings import SlowDetectionSettings

SETTINGS = SlowDetectionSettings(factor=1.4, alpha=0.5, min_samples=3, cooldown_s=30)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def group(*ttfts: float, clock: Clock | None = None) -> list[LatencyStats]:
    stats = [LatencyStats(SETTINGS.alpha, clock or Clock()) for _ in ttfts]
    for s, ttft in zip(stats, ttfts, strict=True):
        for _ in range(3):
            s.record(ttft, ttft / 10)
    return stats


def test_deployment_1_5x_slower_than_its_only_peer_is_slow() -> None:
    assert find_slow(group(0.2, 0.3), SETTINGS) == [1]


def test_similar_deployments_are_not_slow() -> None:
    assert find_slow(group(0.2, 0.25, 0.22), SETTINGS) == []


def test_tiny_absolute_differences_are_noise() -> None:
    assert find_slow(group(0.0001, 0.0003), SETTINGS) == []


def test_too_few_samples_are_not_judged() -> None:
    stats = [LatencyStats(SETTINGS.alpha), LatencyStats(SETTINGS.alpha)]
    stats[0].record(0.1, None)
    stats[1].record(5.0, None)
    assert find_slow(stats, SETTINGS) == []


def test_degraded_deployment_is_measured_afresh_after_cooldown() -> None:
    clock = Clock()
    stats = group(0.2, 0.3, clock=clock)
    stats[1].degrade(SETTINGS.cooldown_s)
    assert stats[1].degraded
    clock.now = 30.0
    stats[1].end_probation_if_due()
    assert not stats[1].degraded
    assert stats[1].ttft.samples == 0


def test_the_only_deployment_with_traffic_is_judged_against_its_own_baseline() -> None:
    primary, idle_peer = LatencyStats(SETTINGS.alpha), LatencyStats(SETTINGS.alpha)
    for _ in range(20):
        primary.record(0.2, 0.02)
    assert find_slow([primary, idle_peer], SETTINGS) == []
    for _ in range(SETTINGS.min_samples):
        primary.record(0.6, 0.06)
    assert find_slow([primary, idle_peer], SETTINGS) == [0]


def test_a_steady_deployment_is_not_slow_against_its_own_baseline() -> None:
    lone, idle_peer = LatencyStats(SETTINGS.alpha), LatencyStats(SETTINGS.alpha)
    for sample in [0.2, 0.22, 0.19, 0.21, 0.2] * 10:
        lone.record(sample, sample / 10)
        assert find_slow([lone, idle_peer], SETTINGS) == []


def test_the_baseline_is_not_consulted_without_a_ready_peer_to_drain_to() -> None:
    only, degraded_peer = LatencyStats(SETTINGS.alpha), LatencyStats(SETTINGS.alpha)
    degraded_peer.degrade(SETTINGS.cooldown_s)
    for _ in range(20):
        only.record(0.2, 0.02)
    for _ in range(SETTINGS.min_samples):
        only.record(0.6, 0.06)
    assert find_slow([only], SETTINGS) == []
    assert find_slow([only, degraded_peer], SETTINGS) == []


def test_with_peer_numbers_the_baseline_is_not_consulted() -> None:
    """Everything slowing down together (load) makes no deployment the outlier."""
    a, b = LatencyStats(SETTINGS.alpha), LatencyStats(SETTINGS.alpha)
    for _ in range(20):
        a.record(0.2, 0.02)
        b.record(0.2, 0.02)
    for _ in range(SETTINGS.min_samples):
        a.record(0.6, 0.06)
        b.record(0.6, 0.06)
    assert find_slow([a, b], SETTINGS) == []
