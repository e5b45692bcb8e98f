"""bench/peers.py's headline ratios (P2, P3, P3b) from per-run summaries, without running any system."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import peers  # noqa: E402
from headlines import headline, read_headlines, with_headlines  # noqa: E402


def summary(system: str, seed: int, sps: float, seconds: float | None, steps: float | None) -> dict:
    return {"system": system, "seed": seed, "end_to_end_sps": sps, "time_to_3_cows_s": seconds,
            "env_steps_to_3_cows": steps}


def test_p3b_compares_median_env_steps_with_the_peer_that_needed_fewest():
    """SB3 is quicker in seconds, RLlib leaner in env steps: P3 and P3b each pick their own peer, and a seed
    that never reached 3 cows counts as infinitely many steps in its median."""
    runs = [summary("craftrl", 0, 2000.0, 50.0, 90_000), summary("craftrl", 1, 2200.0, 60.0, 80_000),
            summary("craftrl", 2, 2100.0, None, None),
            summary("sb3-ppo", 0, 900.0, 100.0, 200_000), summary("sb3-ppo", 1, 950.0, 110.0, 210_000),
            summary("rllib-ppo", 0, 500.0, 200.0, 100_000), summary("rllib-ppo", 1, 520.0, 300.0, 160_000),
            summary("rllib-ppo", 2, 510.0, None, None)]
    headline = peers.headline_ratios(runs)
    assert (headline.fastest, headline.quickest, headline.leanest) == ("sb3-ppo", "sb3-ppo", "rllib-ppo")
    assert headline.p2 == 2100.0 / 925.0
    assert headline.p3 == 60.0 / 105.0
    assert headline.p3b == 90_000 / 160_000


def test_the_headlines_in_the_results_file_are_the_ratios_as_printed_and_name_the_peer():
    """craftrl reached 3 cows on one seed of three, RLlib on two: craftrl's medians are infinite."""
    runs = [summary("craftrl", 0, 2000.0, None, None), summary("craftrl", 1, 2200.0, None, None),
            summary("craftrl", 2, 2100.0, 50.0, 90_000),
            summary("rllib-ppo", 0, 500.0, 200.0, 100_000), summary("rllib-ppo", 1, 520.0, 300.0, 160_000),
            summary("rllib-ppo", 2, 510.0, None, None)]
    figures = peers.headline_figures(runs)
    assert [(f.label, f.value) for f in figures] == [("P2", f"{2100 / 510:.3f}"), ("P3", "inf"), ("P3b", "inf")]
    assert all("RLlib PPO" in f.summary and "3 seeds" in f.summary for f in figures)
    assert headline("P3", "x", math.nan, 3).value == "n/a"  # neither side reached 3 cows
    assert read_headlines(with_headlines("## a section\n\n| table |", figures)) == figures


def test_ratios_when_a_side_never_reached_3_cows():
    assert peers.reached_ratio(math.inf, 100.0) == math.inf
    assert peers.reached_ratio(100.0, math.inf) == 0.0
    assert math.isnan(peers.reached_ratio(math.inf, math.inf))
    assert peers.reached_ratio(50.0, 100.0) == 0.5


def test_curve_reached_needs_a_full_window_and_ignores_a_line_being_written(tmp_path):
    """--stop-at-cows reads a peer's curve.jsonl while the script writes it: 3 cows over fewer than 20 episodes
    does not count, 20 episodes at 3 do, and a half-written last line is skipped rather than crashing."""
    curve = tmp_path / "curve.jsonl"
    assert not peers.curve_reached(tmp_path, 3.0)  # not written yet
    curve.write_text('{"wall_s": 1, "env_steps": 100, "episodes": 5, "cows_mean_last20": 4.0}\n'
                     '{"wall_s": 2, "env_steps": 200, "episodes": 20, "cows_mean_last20": 2.9}\n'
                     '{"wall_s": 3, "env_steps": 300, "episo')
    assert not peers.curve_reached(tmp_path, 3.0)
    assert peers.curve_reached(tmp_path, 2.5)
    curve.write_text(curve.read_text().rsplit("\n", 1)[0]
                     + '\n{"wall_s": 3, "env_steps": 300, "episodes": 21, "cows_mean_last20": 3.0}\n')
    assert peers.curve_reached(tmp_path, 3.0)


def test_the_results_title_names_the_machine_and_any_isa_limits():
    """The variables that keep torch from the CPU's wider instructions are recorded from the environment and
    named in the section's title and command; a run without them reads as before. The title names the machine
    where the run recorded it, so sections from different CPUs are told apart."""
    assert peers.isa_limits({"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "PATH": "/bin",
                             "ATEN_CPU_CAPABILITY": ""}) == {"ONEDNN_MAX_CPU_ISA": "AVX2",
                                                             "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    runs = [{**summary("craftrl", 0, 1000.0, 50.0, 50_000), "params": 189_538},
            {**summary("rllib-ppo", 0, 500.0, 200.0, 100_000), "params": 605_362}]
    context = {"command": "python bench/peers.py --seeds 0", "date": "2026-12-02", "cores": 2, "load_before": 0.5,
               "load_after": 0.7, "versions": "torch", "minutes": 7.0, "stop_at_cows": 3.0, "seeds": [0],
               "systems": ["craftrl", "rllib-ppo"]}
    plain = peers.results_markdown(runs, context, "peers_cows.png")
    limited = peers.results_markdown(runs, {**context, "isa_limits": {"ONEDNN_MAX_CPU_ISA": "AVX2"}},
                                     "peers_cows.png")
    assert "ONEDNN_MAX_CPU_ISA" not in plain
    title, _, first = limited.splitlines()[:3]
    assert title.endswith("(ONEDNN_MAX_CPU_ISA=AVX2)")
    assert first.startswith("`ONEDNN_MAX_CPU_ISA=AVX2 python bench/peers.py --seeds 0`")
    on_a_machine = peers.results_markdown(runs, {**context, "machine": "2 cores (AMD EPYC; avx512_bf16)"},
                                          "peers_cows.png")
    assert on_a_machine.splitlines()[0].endswith("P3b) on 2 cores (AMD EPYC; avx512_bf16)")


def test_a_run_without_a_summary_is_named_in_the_results_and_left_out_of_the_medians():
    """A peer that aborts before writing its summary does not end the benchmark; the results say which run
    is missing, and the medians are over the runs that finished."""
    runs = [{**summary("craftrl", 0, 1000.0, 50.0, 50_000), "params": 189_538},
            {**summary("rllib-ppo", 0, 500.0, 200.0, 100_000), "params": 605_362}]
    context = {"command": "python bench/peers.py --seeds 0 1", "date": "2026-12-02", "cores": 2, "load_before": 0.5,
               "load_after": 0.7, "versions": "torch", "minutes": 7.0, "stop_at_cows": 3.0, "seeds": [0, 1],
               "systems": ["craftrl", "rllib-ppo"]}
    complete = peers.results_markdown(runs, context, "peers_cows.png")
    assert "Wrote no summary" not in complete
    one_missing = peers.results_markdown(runs, context, "peers_cows.png", missing=[("rllib-ppo", 1)])
    assert "Wrote no summary, so left out of the medians (see each run's log.txt): RLlib PPO, new API stack seed 1." \
        in one_missing
    assert "**P3b** (craftrl / the peer with the fewest, RLlib PPO, new API stack, median env steps to 3 cows): " \
        "**0.50**." in one_missing


def test_seeds_are_drawn_above_every_seed_used_here_unless_named(capsys):
    import argparse
    import random

    from seeds import HELD_OUT_FROM, add_seed_arguments, draw_seeds, seeds_from

    drawn = draw_seeds(10, random.Random(3))
    assert len(set(drawn)) == 10 and min(drawn) >= HELD_OUT_FROM
    parser = argparse.ArgumentParser()
    add_seed_arguments(parser, count=10)
    seeds, was_drawn = seeds_from(parser.parse_args([]), "peers")
    assert was_drawn and len(seeds) == 10 and min(seeds) >= HELD_OUT_FROM
    assert capsys.readouterr().out == f"peers: seeds {' '.join(map(str, seeds))} (drawn at random now)\n"
    assert seeds_from(parser.parse_args(["--seeds", "4", "5"]), "peers") == ([4, 5], False)
    assert capsys.readouterr().out == "peers: seeds 4 5 (named by --seeds)\n"
    assert len(seeds_from(parser.parse_args(["--num-seeds", "3"]), "peers")[0]) == 3


def test_quartiles_interpolate_and_a_run_that_never_got_there_sorts_last():
    from seeds import spread

    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0, 4.0)
    assert spread([10.0, 20.0, 30.0, 40.0]) == (25.0, 17.5, 32.5)
    median, low, high = spread([10.0, 20.0, 30.0, math.inf])
    assert (median, low, high) == (25.0, 17.5, math.inf), "the third quartile reaches into the run that missed"
    assert spread([math.inf, math.inf]) == (math.inf, math.inf, math.inf)


def test_the_summary_gives_each_systems_median_its_interquartile_range_and_the_runs_that_missed():
    runs = [{**summary("craftrl", seed, 700.0 + 10 * seed, 60.0 + seed, 50_000 + 1000 * seed), "params": 189_538}
            for seed in range(4)]
    runs += [{**summary("rllib-ppo", 0, 500.0, 200.0, 100_000), "params": 605_362},
             {**summary("rllib-ppo", 1, 520.0, 300.0, 150_000), "params": 605_362},
             {**summary("rllib-ppo", 2, 540.0, None, None), "params": 605_362}]
    context = {"command": "python bench/peers.py", "date": "2026-12-06", "cores": 2, "load_before": 0.5,
               "load_after": 0.7, "versions": "torch", "minutes": 7.0, "stop_at_cows": 3.0, "seeds": [0, 1, 2, 3],
               "seeds_drawn": True, "systems": ["craftrl", "rllib-ppo"]}
    text = peers.results_markdown(runs, context, "peers_cows.png")
    assert "| craftrl (default config) | 715 (708 - 722) | 62 s (61 s - 62 s) | 51500 (50750 - 52250) | 0 | 4 |" in text
    assert "| RLlib PPO, new API stack | 520 (510 - 530) | 300 s (250 s - not reached) | 150000 " \
           "(125000 - not reached) | 1 | 3 |" in text
    assert "The seeds were drawn at random when the run started" in text
