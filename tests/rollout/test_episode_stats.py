from craftrl.rollout.episode_stats import EpisodeStatistics
from craftrl.rollout.loop import EpisodeRecord, episode_metrics


def record(ret, length=10, restarted=False, **metrics):
    return EpisodeRecord("e", ret, length, ret * 0.5, metrics, restarted, 0)


def test_moving_window_and_counts_since_last_summary():
    stats = EpisodeStatistics(moving_window=2)
    for ret in (1.0, 2.0, 6.0):
        stats.report(record(ret, cows_killed=ret))
    summary = stats.summary()
    assert summary["episodes/return_mean"] == 4.0  # only the last two episodes
    assert summary["episodes/cows_killed_mean"] == 4.0
    assert summary["episodes/new"] == 3 and summary["episodes/total"] == 3
    stats.report(record(0.0, restarted=True))
    summary = stats.summary()
    assert summary["episodes/new"] == 1 and summary["episodes/return_mean_new"] == 0.0
    assert summary["episodes/env_restarted_total"] == 1


def test_episode_metrics_keep_numeric_scalars_and_one_level_of_dicts():
    info = {"cows_killed": 3, "achievements": {"eat_cow": 3, "collect_wood": 1}, "semantic": [[1]], "flag": True,
            "name": "x"}
    assert episode_metrics(info) == {"cows_killed": 3.0, "achievements/eat_cow": 3.0,
                                     "achievements/collect_wood": 1.0}


def test_every_episode_is_taken_exactly_once_in_order_and_summaries_do_not_consume_them():
    stats = EpisodeStatistics(moving_window=2)
    for ret in (1.0, 2.0, 3.0):
        stats.report(record(ret, cows_killed=ret))
    stats.summary()
    taken = stats.take_records()
    assert [r["episode_return"] for r in taken] == [1.0, 2.0, 3.0]
    assert taken[0]["metrics"] == {"cows_killed": 1.0}
    assert stats.take_records() == []
    stats.report(record(4.0))
    assert [r["episode_return"] for r in stats.take_records()] == [4.0]


def test_untaken_records_are_bounded_and_the_loss_is_counted(monkeypatch):
    monkeypatch.setattr(EpisodeStatistics, "MAX_UNTAKEN_RECORDS", 3)
    stats = EpisodeStatistics()
    for ret in range(5):
        stats.report(record(float(ret)))
    assert [r["episode_return"] for r in stats.take_records()] == [2.0, 3.0, 4.0]
    assert stats.summary()["episodes/records_dropped_total"] == 2
