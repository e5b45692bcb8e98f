"""``craftrl`` command line: train, eval, plot, config show, config check.

Exit codes: 0 success, 2 bad input (config, arguments, cluster too small) -- always one line per problem
and never a traceback --, 1 when a started run could not go on (no rollout worker can run), and 130 when a
training run was stopped by Ctrl-C or SIGTERM (after a checkpoint).
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
from typing import NoReturn, Sequence

from craftrl.config.loading import config_to_yaml, load_config
from craftrl.config.validate import ConfigError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's convention for a run stopped by Ctrl-C


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints a usage block before its error; craftrl's promise is one ``craftrl: error:`` line."""

    def error(self, message: str) -> NoReturn:
        print(f"craftrl: error: {message}; see '{self.prog} --help'", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="craftrl", description="Distributed online PPO for game agents on Ray.")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a policy online")
    _add_config_arguments(train)
    train.add_argument("--address", default=None,
                       help="join an existing Ray cluster ('auto' or host:port) instead of starting one")
    train.add_argument("--resume", default=None,
                       help="'latest' (the newest run of this config's name under output_root), a run directory or "
                            "a checkpoint directory; continues that run (sets train_config.resume)")

    evaluate = commands.add_parser("eval", help="play episodes with a checkpoint and print their returns")
    evaluate.add_argument("checkpoint", help="checkpoint directory, or a run directory (its newest checkpoint)")
    evaluate.add_argument("--episodes", type=int, default=5, help="episodes to play (default 5)")
    evaluate.add_argument("--video", default=None, metavar="OUT.mp4", help="record the episodes to this mp4")
    evaluate.add_argument("--deterministic", action="store_true", help="take the most likely action")
    evaluate.add_argument("--config", default=None, help="config to build env and policy (default: the run's own)")

    plot = commands.add_parser("plot", help="learning curves of one or more runs")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    plot.add_argument("--out", default=None, help="output PNG (default: RUN_DIR/curve.png)")
    plot.add_argument("--metric", action="append", default=[], metavar="NAME",
                      help="a task metric to plot under the return, e.g. cows_killed (repeatable)")

    config = commands.add_parser("config", help="inspect a config")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the resolved config (defaults filled in) as YAML")
    _add_config_arguments(show)
    check = config_commands.add_parser("check", help="validate a config; exit 0 when valid, 2 otherwise")
    _add_config_arguments(check)
    return parser


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="config module (dotted name), .py file or .yaml file")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="override config keys")


def one_line(problem: str) -> str:
    """A problem as one line: the exit-2 promise is one stderr line per problem, even if a message spans lines."""
    return " ".join(line.strip() for line in str(problem).splitlines() if line.strip())


def _check_output_file(key: str, path: str, example: str) -> None:
    from craftrl.run_dir import unwritable_output_file

    problems = unwritable_output_file(key, path, example)
    if problems:
        raise ConfigError(problems)


def main(argv: Sequence[str] | None = None) -> int:
    # `kill -USR1 <pid>` prints every thread's Python stack to stderr: the way to see where a run that will
    # not stop (or not start) is waiting, without stopping it.
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    parser = build_parser()
    # argparse ends a command's positionals at its first option: `train CONFIG --resume latest key=value` leaves
    # the overrides after the option unparsed, so they are collected here
    args, unparsed = parser.parse_known_args(argv)
    if unparsed and hasattr(args, "overrides") and not any(arg.startswith("-") for arg in unparsed):
        args.overrides = [*args.overrides, *unparsed]
    elif unparsed:
        parser.error(f"unrecognized arguments: {' '.join(unparsed)}")
    try:
        if args.command == "config":
            loaded = load_config(args.config, args.overrides)
            if args.config_command == "show":
                print(config_to_yaml(loaded.online), end="")
            else:
                print(f"ok: {args.config} is a valid craftrl config")
            return 0
        if args.command == "eval":
            from craftrl.cli.evaluate import eval_command

            if args.episodes < 1:
                raise ConfigError([f"eval: --episodes: expected >= 1, got {args.episodes}"])
            if args.video is not None:  # checked before the episodes are played, not after
                _check_output_file("eval: --video", args.video, "eval.mp4")
            return eval_command(args.checkpoint, args.episodes, args.video, args.deterministic, args.config)
        if args.command == "plot":
            from craftrl.cli.plot import plot_command

            if args.out is not None:
                _check_output_file("plot: --out", args.out, "curve.png")
            return plot_command(args.run_dirs, args.out, args.metric)
        if args.command == "train":
            from craftrl.cli.train import train_command

            overrides = list(args.overrides)
            if args.resume is not None:
                overrides.append(f"train_config.resume={args.resume}")
            if args.address is not None:
                overrides.append(f"ray_config.address={args.address}")
            return train_command(load_config(args.config, overrides))
    except ConfigError as error:
        for problem in error.problems:
            print(f"craftrl: error: {one_line(problem)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C before training started (a slow env build in the preflight, say)
        print("craftrl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    parser.error(f"unknown command {args.command!r}")
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
