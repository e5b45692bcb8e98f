"""A table of malformed configs and inputs, each run through the CLI.

The promise under test (craftrl/cli/main.py): bad input exits with code 2 and exactly one stderr line,
``craftrl: error: ...``, that names the culprit (key path, generator, file) and what was expected -- never a
traceback. Every case here is a single-problem input, so it must give exactly one line.

Most cases call ``craftrl.cli.main.main`` in-process; ``capfd`` captures at the file-descriptor level, so the
output of the preflight's env process is checked too. Cases that reach ``craftrl train``'s run-time checks
(env, policy, resume) must fail in its preflight, before Ray starts: ``ray_init`` is replaced by a function that
fails the test. A few representative cases also run in a real subprocess, to check the process-level behaviour.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

import craftrl.cli.train
from craftrl.cli.main import main

HEADER = """\
import functools
import threading

import numpy as np
import torch

from craftrl.testing.scripted_env import ScriptedEnv
from craftrl.policies import ImpalaRecurrentPolicy, default_policy_generator

TINY_POLICY = dict(num_actions=2, image_shape=(8, 8, 3), hidden_size=16, channels=(4, 4, 4))
"""

GOOD_ENV = "env_generator = functools.partial(ScriptedEnv, episode_length=6)"
GOOD_POLICY = "policy_generator = functools.partial(default_policy_generator, **TINY_POLICY)"
GOOD_ONLINE = """\
online_dict = {
    "detach_rollout_manager": False,
    "rollout_config": {
        "num_cpus_per_worker": 0,
        "fragment_length": 8,
        "worker_config": {"num_envs": 2, "batch_size": 2},
        "replay_buffer_config": {"max_chunks": 32, "database_config": {"num_shards": 1}},
    },
    "train_config": {"num_iterations": 2, "batch_size_per_gpu": 2, "batches_per_iteration": 2,
                     "context_length": 4, "save_interval": 1, "keep_interval": 0, "num_readers": 1},
    "logger_config": {"name": "bad-input", "console_interval": 0},
}
"""


def config_module(env: str = GOOD_ENV, policy: str = GOOD_POLICY, online: str = GOOD_ONLINE) -> str:
    """A variant of tests/config_fixtures/tiny.py with one part replaced."""
    return "\n".join([HEADER, textwrap.dedent(env), textwrap.dedent(policy), textwrap.dedent(online)])


def broken_env(body: str) -> str:
    """An env_generator that is ScriptedEnv with one method overridden by ``body``."""
    return "class BrokenEnv(ScriptedEnv):\n" + textwrap.indent(textwrap.dedent(body), "    ") + \
        "\n\nenv_generator = BrokenEnv\n"


def broken_policy(forward_body: str, **extra: str) -> str:
    """A policy_generator whose forward post-processes the default policy's ``latents`` with ``forward_body``."""
    return ("class BrokenPolicy(ImpalaRecurrentPolicy):\n"
            "    def forward(self, input, state_in, first=None):\n"
            "        latents, state_out = super().forward(input, state_in, first)\n"
            + textwrap.indent(textwrap.dedent(forward_body), "        ")
            + "\n        return latents, state_out\n\n"
            "policy_generator = functools.partial(BrokenPolicy, **TINY_POLICY)\n")


@dataclass
class Case:
    """``argv(tmp_path)`` builds the files the case needs and returns the CLI arguments."""

    name: str
    argv: Callable[[Path], list[str]]
    expect: tuple[str, ...]  # substrings of the single error line: the culprit and what was expected


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def train(module_text: str, *extra: str) -> Callable[[Path], list[str]]:
    """``craftrl train <module> output_root=<tmp>/runs <extra...>`` with the module written to tmp_path."""

    def argv(tmp_path: Path) -> list[str]:
        return ["train", write(tmp_path, "config.py", module_text), f"output_root={tmp_path / 'runs'}", *extra]

    return argv


def train_resume(make_resume_dir: Callable[[Path], str]) -> Callable[[Path], list[str]]:
    def argv(tmp_path: Path) -> list[str]:
        return [*train(config_module())(tmp_path), "--resume", make_resume_dir(tmp_path)]

    return argv


def train_writing_under_a_file(key: str) -> Callable[[Path], list[str]]:
    """``craftrl train`` with the output directory ``key`` inside a file, where no directory can be made."""

    def argv(tmp_path: Path) -> list[str]:
        return [*train(config_module())(tmp_path), f"{key}={write(tmp_path, 'a_file', 'text')}/outputs"]

    return argv


def garbage_checkpoint(tmp_path: Path) -> str:
    directory = tmp_path / "iter_00000007"
    directory.mkdir()
    (directory / "state.pt").write_bytes(b"this is not a checkpoint\x00\x01" * 64)
    return str(directory)


def foreign_torch_file(tmp_path: Path) -> str:
    directory = tmp_path / "foreign"
    directory.mkdir()
    torch.save({"weights": [1, 2, 3]}, directory / "state.pt")
    return str(directory)


def tiny_checkpoint(tmp_path: Path, directory: str, num_actions: int, iteration: int) -> str:
    """A checkpoint of the tiny policy with ``num_actions`` actions that has trained ``iteration`` iterations."""
    from craftrl.policies import default_policy_generator

    policy = default_policy_generator(num_actions=num_actions, image_shape=(8, 8, 3), hidden_size=16,
                                      channels=(4, 4, 4))
    (tmp_path / directory).mkdir()
    torch.save({"model": policy.state_dict(), "training": {"iteration": iteration}}, tmp_path / directory / "state.pt")
    return str(tmp_path / directory)


def other_architecture_checkpoint(tmp_path: Path) -> str:
    """5 actions instead of the tiny config's 2 (only the action head differs)."""
    return tiny_checkpoint(tmp_path, "other_arch", num_actions=5, iteration=1)


def finished_checkpoint(tmp_path: Path) -> str:
    """The tiny policy, having trained the tiny config's 2 iterations."""
    return tiny_checkpoint(tmp_path, "iter_00000002", num_actions=2, iteration=2)


def junk_dir(tmp_path: Path) -> str:
    directory = tmp_path / "junk"
    directory.mkdir()
    (directory / "notes.txt").write_text("not a checkpoint")
    return str(directory)


def yaml_config(text: str) -> Callable[[Path], list[str]]:
    return lambda tmp_path: ["config", "check", write(tmp_path, "config.yaml", textwrap.dedent(text))]


def online_with(replacement: str, original: str) -> str:
    assert original in GOOD_ONLINE, original
    return GOOD_ONLINE.replace(original, replacement)


CASES = [
    # ------------------------------------------------------------------ config files and modules
    Case("py file does not exist", lambda p: ["train", str(p / "nope.py")], ("nope.py: config file not found",)),
    Case("yaml file does not exist", lambda p: ["config", "check", str(p / "nope.yaml")],
         ("nope.yaml: config file not found",)),
    Case("yaml syntax error", yaml_config("online_dict: {train_config: [1, 2\n"), ("config.yaml: not valid YAML",)),
    Case("dotted module does not exist", lambda p: ["train", "no_such_package.configs.cows"],
         ("no_such_package.configs.cows: no such config module",)),
    Case("module without env_generator", train(config_module(env="")), ("the config must define env_generator",)),
    Case("module without policy_generator", train(config_module(policy="")),
         ("the config must define policy_generator",)),
    Case("module without online_dict", train(config_module(online="")), ("the config must define online_dict",)),
    Case("module that fails to import", train("import no_such_module_anywhere\n" + config_module()),
         ("importing the config failed: ModuleNotFoundError",)),
    Case("online_dict is a list", train(config_module(online="online_dict = [1, 2]")),
         ("online_dict: expected a dict, got list",)),
    Case("env_generator is not callable", train(config_module(env="env_generator = 42")),
         ("env_generator: expected a callable taking no arguments, got 42",)),
    Case("policy_generator is not callable", train(config_module(policy="policy_generator = 'default'")),
         ("policy_generator: expected a callable taking no arguments, got 'default'",)),
    Case("generator needs arguments", train(config_module(env="def env_generator(task):\n    return task")),
         ("env_generator: expected a callable taking no arguments", "needs arguments")),
    Case("yaml with an unknown top-level key", yaml_config("""
            env_generator: craftrl.testing.scripted_env:ScriptedEnv
            policy_generator: craftrl.policies:default_policy_generator
            trainer_config: {}
            """), ("trainer_config: unknown top-level key; expected env_generator, policy_generator, online_dict",)),
    Case("yaml generator that cannot be imported", yaml_config("""
            env_generator: no_such_package.tasks:make_env
            policy_generator: craftrl.policies:default_policy_generator
            """), ("env_generator: cannot import 'no_such_package.tasks:make_env'",)),
    Case("yaml without policy_generator", yaml_config("env_generator: craftrl.testing.scripted_env:ScriptedEnv\n"),
         ("policy_generator: missing; expected an import path",)),
    # ------------------------------------------------------------------ wrong types and unknown keys
    Case("string where a number belongs", train(config_module(), "train_config.learning_rate=fast"),
         ("train_config.learning_rate: expected a number, got 'fast'",)),
    Case("float where an integer belongs", train(config_module(online=online_with('"fragment_length": 8.5',
                                                                                   '"fragment_length": 8'))),
         ("rollout_config.fragment_length: expected an integer, got 8.5",)),
    Case("scalar where a section belongs", train(config_module(), "rollout_config.worker_config=5"),
         ("rollout_config.worker_config: expected a mapping (a section of keys), got 5",)),
    Case("word where a boolean belongs", train(config_module(), "train_config.clip_vloss=maybe"),
         ("train_config.clip_vloss: expected a boolean, got 'maybe'",)),
    Case("value outside its choices", train(config_module(), "logger_config.wandb_mode=loud"),
         ("logger_config.wandb_mode: expected one of 'auto', 'online', 'offline', 'disabled', got 'loud'",)),
    Case("misspelt key in an override", train(config_module(), "train_config.learnin_rate=1e-4"),
         ("train_config.learnin_rate: unknown key; did you mean learning_rate?",)),
    Case("misspelt key in the file", train(config_module(online=online_with('"num_env": 2', '"num_envs": 2'))),
         ("rollout_config.worker_config.num_env: unknown key; did you mean num_envs?",)),
    Case("override of a key that does not exist", train(config_module(), "train_config.zzz=1"),
         ("train_config.zzz: unknown key; valid keys here:",)),
    Case("override without '='", train(config_module(), "train_config.learning_rate"),
         ("override 'train_config.learning_rate': expected key.path=value",)),
    Case("override inside a scalar key", train(config_module(), "train_config.num_iterations.value=1"),
         ("train_config.num_iterations.value: cannot override inside 'num_iterations', which is not a section",)),
    Case("unknown command-line option", train(config_module(), "--checkpoint", "latest"),
         ("unrecognized arguments: --checkpoint latest",)),
    # ------------------------------------------------------------------ impossible values and combinations
    Case("negative fragment length", train(config_module(), "rollout_config.fragment_length=-8"),
         ("rollout_config.fragment_length: expected >= 1, got -8",)),
    Case("zero rollout workers", train(config_module(), "rollout_config.num_rollout_workers=0"),
         ("rollout_config.num_rollout_workers: expected >= 1, got 0",)),
    Case("inference batch larger than the envs", train(config_module(), "rollout_config.worker_config.batch_size=3"),
         ("rollout_config.worker_config.batch_size: expected <= worker_config.num_envs (2), got 3",)),
    Case("batch not made of whole chunks",
         train(config_module(), "rollout_config.replay_buffer_config.fragments_per_chunk=3"),
         ("train_config.batch_size_per_gpu: expected a multiple of replay_buffer_config.fragments_per_chunk (3)",)),
    Case("buffer smaller than one batch", train(config_module(), "rollout_config.replay_buffer_config.max_chunks=1"),
         ("rollout_config.replay_buffer_config.max_chunks: expected >= the chunks one batch needs (2), got 1",)),
    Case("value warm-up longer than training", train(config_module(), "train_config.vf_warmup=2"),
         ("train_config.vf_warmup: expected < num_iterations (2), got 2",)),
    Case("kept checkpoints that are never saved",
         train(config_module(), "train_config.save_interval=3", "train_config.keep_interval=4"),
         ("train_config.keep_interval: expected a multiple of save_interval (3), got 4",)),
    Case("output root inside a file", train_writing_under_a_file("output_root"),
         ("output_root: cannot make a directory at", "a_file is not a directory")),
    Case("checkpoint directory inside a file", train_writing_under_a_file("train_config.save_path"),
         ("train_config.save_path: cannot make a directory at", "a_file is not a directory")),
    Case("video directory inside a file", train_writing_under_a_file("rollout_config.worker_config.video_output_dir"),
         ("rollout_config.worker_config.video_output_dir: cannot make a directory at", "a_file is not a directory")),
    Case("more GPUs than the machine has", train(config_module(), "train_config.num_gpus_per_worker=4096"),
         ("4096 GPU", "set rollout_config.num_gpus_per_worker and train_config.num_gpus_per_worker to 0")),
    # ------------------------------------------------------------------ envs (preflight, in an env process)
    Case("env_generator raises", train(config_module(env="""
            def env_generator():
                raise ValueError("no map named 'castle'\\nsecond line of the message")
            """)),
         ("env_generator raised ValueError: no map named 'castle' second line of the message (at config.py:",)),
    Case("MinecraftSim on a machine without MineStudio", train(config_module(env="""
            from craftrl.envs import env_generator as named_env_generator

            env_generator = named_env_generator("minecraft/sim")
            """)), ("env_generator raised MinecraftUnavailableError: MinecraftSim cannot run on this machine",
                    "Missing: - the Python package `minestudio` is not installed: `pip install minestudio`",
                    "needs none of this: use craftrl.envs.make('crafter/cows')")),
    Case("env_generator cannot be pickled", train(config_module(
        env="env_generator = functools.partial(ScriptedEnv, episode_length=threading.Lock())")),
         ("env_generator: cannot be pickled to send it to env processes", "expected a module-level function")),
    Case("env_generator returns no env", train(config_module(env="def env_generator():\n    return 42")),
         ("env_generator: returned an int without reset(), step(), close()", "expected an env with reset/step")),
    Case("task_metrics that are not a tuple of names", train(config_module(env=broken_env("""
            task_metrics = "cows_killed"
            """))), ("env_generator: task_metrics: expected a tuple of info keys (str), got 'cows_killed'",)),
    Case("observation is not a dict", train(config_module(env=broken_env("""
            def reset(self, seed=None):
                obs, info = super().reset(seed)
                return obs["image"], info
            """))), ("env_generator: reset() returned an observation that is a uint8 array of shape [8, 8, 3]",
                     "expected a dict with 'image': uint8 [H, W, 3]")),
    Case("observation without 'image'", train(config_module(env=broken_env("""
            def reset(self, seed=None):
                obs, info = super().reset(seed)
                return {"pixels": obs["image"]}, info
            """))), ("env_generator: reset() returned an observation without key 'image'", "keys: 'pixels'",
                     "expected a dict with 'image'")),
    Case("image of the wrong dtype", train(config_module(env=broken_env("""
            def _obs(self):
                return {"image": np.zeros((8, 8, 3), np.float32)}
            """))), ("env_generator: reset() returned obs['image'] as a float32 array of shape [8, 8, 3]",
                     "expected a dict with 'image': uint8 [H, W, 3]")),
    Case("image of the wrong ndim", train(config_module(env=broken_env("""
            def _obs(self):
                return {"image": np.zeros((8, 8), np.uint8)}
            """))), ("env_generator: reset() returned obs['image'] as a uint8 array of shape [8, 8]",
                     "expected a dict with 'image': uint8 [H, W, 3]")),
    Case("reset returns only the observation", train(config_module(env=broken_env("""
            def reset(self, seed=None):
                return super().reset(seed)[0]
            """))), ("env_generator: reset() returned a dict (expected a tuple (obs, info); the old gym API",)),
    Case("step returns the old 4-tuple", train(config_module(env=broken_env("""
            def step(self, action):
                obs, reward, terminated, truncated, info = super().step(action)
                return obs, reward, terminated or truncated, info
            """))), ("env_generator: step() returned a tuple of 4 items",
                     "expected a tuple (obs, reward, terminated, truncated, info)")),
    Case("step returns a non-bool terminated", train(config_module(env=broken_env("""
            def step(self, action):
                obs, reward, terminated, truncated, info = super().step(action)
                return obs, reward, None, truncated, info
            """))), ("env_generator: step() returned terminated as a NoneType (expected a bool)",)),
    Case("reset raises", train(config_module(
        env="env_generator = functools.partial(ScriptedEnv, fail_in='reset', fail_mode='raise')")),
         ("env_generator: reset() raised RuntimeError: ScriptedEnv: scripted failure in reset call 1",)),
    Case("step raises on the policy's action", train(config_module(
        env="env_generator = functools.partial(ScriptedEnv, fail_in='step', fail_mode='raise')")),
         ("env_generator: step() of the policy's action ", "raised RuntimeError: ScriptedEnv: scripted failure in "
          "step call 1")),
    Case("env that takes fewer actions than the policy samples", train(config_module(
        env=broken_env("""
            def step(self, action):
                return super().step(("noop",)[int(action)])  # an env of one action, which declares none
            """),
        policy="policy_generator = functools.partial(default_policy_generator, **dict(TINY_POLICY, num_actions=17))")),
         ("env_generator: step() of the policy's action ", "raised IndexError: tuple index out of range")),
    Case("reset hangs", train(config_module(
        env="env_generator = functools.partial(ScriptedEnv, fail_in='reset', fail_mode='hang')"),
        "rollout_config.worker_config.reset_timeout=1"),
         ("env_generator: building and resetting the env took longer than "
          "rollout_config.worker_config.reset_timeout (1 s)",)),
    Case("env process dies", train(config_module(
        env="env_generator = functools.partial(ScriptedEnv, fail_in='reset', fail_mode='exit')")),
         ("env_generator: the env process died during building and resetting the env (exit code 3)",)),
    # ------------------------------------------------------------------ policies (preflight, in the driver)
    Case("policy_generator raises", train(config_module(policy="""
            def policy_generator():
                raise RuntimeError("CUDA out of memory")
            """)), ("policy_generator raised RuntimeError: CUDA out of memory (at config.py:",)),
    Case("policy_generator returns a dict", train(config_module(policy="def policy_generator():\n    return {}")),
         ("policy_generator: returned a dict (expected a torch.nn.Module subclass of craftrl.policies.Policy",)),
    Case("policy is a module but not a policy",
         train(config_module(policy="def policy_generator():\n    return torch.nn.Linear(4, 2)")),
         ("policy_generator: returned Linear, which has no initial_state, act, pi_head, value_head",
          "expected a torch.nn.Module subclass of craftrl.policies.Policy")),
    Case("policy without pi_logits", train(config_module(policy=broken_policy("latents.pop('pi_logits')"))),
         ("policy_generator: forward() returned latents without 'pi_logits'", "expected 'pi_logits' and 'vpred'")),
    Case("vpred of the wrong shape",
         train(config_module(policy=broken_policy("latents['vpred'] = latents['vpred'][..., None]"))),
         ("policy_generator: forward() returned vpred as a float32 tensor of shape [1, 1, 1]",
          "expected a float tensor of shape [B, T] = [1, 1]")),
    Case("logits that are not log-probabilities",
         train(config_module(policy=broken_policy("latents['pi_logits'] = latents['pi_logits'] + 5.0"))),
         ("policy_generator: forward() returned pi_logits that are not normalised log-probabilities",
          "expected the output of log_softmax")),
    Case("logits for the wrong number of actions", train(config_module(
        env="""
            import gymnasium

            class TwoActionEnv(ScriptedEnv):
                action_space = gymnasium.spaces.Discrete(2)

            env_generator = TwoActionEnv
            """,
        policy="policy_generator = functools.partial(default_policy_generator, **dict(TINY_POLICY, num_actions=3))")),
         ("policy_generator: forward() returned pi_logits for 3 actions (expected 2, the env's action_space.n)",)),
    Case("policy built for other images", train(config_module(
        policy="policy_generator = functools.partial(default_policy_generator, "
               "**dict(TINY_POLICY, image_shape=(16, 16, 3)))")),
         ("policy_generator: forward() on the env's first observation raised ValueError: ImpalaRecurrentPolicy: "
          "input 'image' is [8, 8, 3] per step, but the policy was built for image_shape (16, 16, 3)",
          "observation: image uint8 [8, 8, 3]")),
    # ------------------------------------------------------------------ resume
    Case("resume path that does not exist", train_resume(lambda p: str(p / "no" / "such" / "checkpoint")),
         ("train_config.resume:", "checkpoint does not exist (expected", "a checkpoint directory holding state.pt")),
    Case("resume from a directory of junk", train_resume(junk_dir),
         ("train_config.resume:", "junk holds no checkpoint (expected a checkpoint directory holding state.pt")),
    Case("resume from a garbage state.pt", train_resume(garbage_checkpoint),
         ("train_config.resume:", "state.pt is unreadable (not a torch.save archive")),
    Case("resume from a torch file that is no checkpoint", train_resume(foreign_torch_file),
         ("train_config.resume:", "state.pt is not a craftrl checkpoint (expected a dict with 'model'")),
    Case("resume from another architecture's checkpoint", train_resume(other_architecture_checkpoint),
         ("train_config.resume: the weights in", "do not fit the policy from policy_generator",
          "'pi_head.linear_layer.weight' is [5, 16] in the checkpoint but [2, 16] in the policy",
          "reads VPT_MODEL) builds the trained policy only with them as they were")),
    Case("resume from a checkpoint that trained every iteration", train_resume(finished_checkpoint),
         ("train_config.num_iterations: 2, and", "iter_00000002 has already trained 2 iterations",
          "pass train_config.num_iterations=N with N > 2")),
    Case("resume latest without checkpoints", train_resume(lambda p: "latest"),
         ("train_config.resume=latest:", "holds a checkpoint", "pass --resume with a checkpoint")),
    # ------------------------------------------------------------------ eval
    Case("eval of a path that does not exist", lambda p: ["eval", str(p / "no_run")],
         ("eval:", "no_run does not exist (expected a run directory")),
    Case("eval of a directory without checkpoints", lambda p: ["eval", junk_dir(p)],
         ("eval:", "junk: no checkpoint here (expected a run directory")),
    Case("eval of a garbage checkpoint", lambda p: ["eval", garbage_checkpoint(p)],
         ("eval:", "state.pt: unreadable checkpoint (UnpicklingError")),
    Case("eval of a checkpoint with another architecture", lambda p: [
        "eval", other_architecture_checkpoint(p), "--config", write(p, "config.py", config_module())],
         ("eval: the checkpoint's weights do not fit the policy from policy_generator",
          "'pi_head.linear_layer.weight' is [5, 16] in the checkpoint but [2, 16] in the policy",
          "pass --config with the config it was trained with; a config that reads environment variables")),
    Case("eval of zero episodes", lambda p: ["eval", junk_dir(p), "--episodes", "0"],
         ("eval: --episodes: expected >= 1, got 0",)),
    Case("eval --video in a directory that cannot be made",
         lambda p: ["eval", junk_dir(p), "--video", f"{write(p, 'a_file', 'text')}/eval.mp4"],
         ("eval: --video: cannot make a directory at", "a_file is not a directory")),
    Case("eval --video naming a directory", lambda p: ["eval", junk_dir(p), "--video", str(p)],
         ("eval: --video:", "is a directory (expected a file path such as")),
    Case("plot --out in a directory that cannot be made",
         lambda p: ["plot", junk_dir(p), "--out", f"{write(p, 'a_file', 'text')}/curve.png"],
         ("plot: --out: cannot make a directory at", "a_file is not a directory")),
]


def assert_one_error_line(code: int, out: str, err: str, expect: tuple[str, ...]) -> str:
    assert "Traceback" not in out + err, err
    assert code == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("craftrl: error: "), err
    for part in expect:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def ray_must_not_start(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("bad input reached ray_init: it must be rejected before Ray starts")

    monkeypatch.setattr(craftrl.cli.train, "ray_init", fail)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_exits_2_with_one_line_naming_the_problem(case: Case, tmp_path: Path, capfd,
                                                            ray_must_not_start) -> None:
    argv = case.argv(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's errors leave through sys.exit
        code = exit_.code
    out, err = capfd.readouterr()
    assert_one_error_line(code, out, err, case.expect)
    runs = tmp_path / "runs"
    if argv[0] == "train":
        assert not runs.exists() or not any(runs.iterdir()), "bad input must be rejected before a run directory"


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 32
    assert len({case.name for case in CASES}) == len(CASES)


# ---------------------------------------------------------------------------------------------- real processes

PROCESS_CASES = ["py file does not exist", "env_generator raises", "resume from a garbage state.pt",
                 "eval of a garbage checkpoint"]


def test_real_processes_exit_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    """The same promise at the process level: the interpreter exits 2, nothing else reaches stderr."""
    by_name = {case.name: case for case in CASES}
    running = []
    for index, name in enumerate(PROCESS_CASES):
        case_dir = tmp_path / str(index)
        case_dir.mkdir()
        argv = by_name[name].argv(case_dir)
        process = subprocess.Popen([sys.executable, "-m", "craftrl.cli.main", *argv], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        running.append((by_name[name], process))
    for case, process in running:
        out, err = process.communicate(timeout=120)
        assert_one_error_line(process.returncode, out, err, case.expect)


def test_preflight_false_leaves_the_env_and_policy_checks_to_the_run(tmp_path: Path, monkeypatch, capfd) -> None:
    """The opt-out for drivers that cannot build the env: the same broken policy then gets as far as Ray."""

    class RayReached(Exception):
        pass

    def reached(*args, **kwargs):
        raise RayReached

    monkeypatch.setattr(craftrl.cli.train, "ray_init", reached)
    argv = train(config_module(policy=broken_policy("latents['vpred'] = latents['vpred'][..., None]")),
                 "rollout_config.worker_config.preflight=false")(tmp_path)
    with pytest.raises(RayReached):
        main(argv)
    assert "craftrl: error:" not in capfd.readouterr().err
