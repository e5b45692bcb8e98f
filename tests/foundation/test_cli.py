"""The CLI as a user runs it: a real subprocess, exit codes and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
SEED = str(TESTS / "config_fixtures" / "seed004.py")
TINY = str(TESTS / "config_fixtures" / "tiny.py")


def craftrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "craftrl.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


def test_config_check_accepts_the_seed_004_module():
    result = craftrl("config", "check", SEED)
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_config_check_rejects_a_misspelt_key_with_a_suggestion_and_no_traceback():
    result = craftrl("config", "check", SEED, "train_config.learnin_rate=0.1")
    assert result.returncode == 2
    assert result.stderr.strip() == "craftrl: error: train_config.learnin_rate: unknown key; did you mean learning_rate?"
    assert "Traceback" not in result.stderr


def test_config_show_prints_the_resolved_config_with_overrides():
    result = craftrl("config", "show", SEED, "train_config.learning_rate=3e-4")
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["train_config"]["learning_rate"] == 3e-4
    assert shown["rollout_config"]["worker_config"]["step_timeout"] == 60.0  # a default filled in


def test_train_with_a_bad_config_fails_before_creating_anything(tmp_path: Path):
    result = craftrl("train", SEED, f"output_root={tmp_path}", "rollout_config.fragment_length=0")
    assert result.returncode == 2
    assert "rollout_config.fragment_length: expected >= 1, got 0" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """``craftrl train`` of the tiny config, once for the tests that read what it wrote (a run takes ~30 s on 2
    cores); returns the CLI's result and the output root."""
    root = tmp_path_factory.mktemp("tiny_runs")
    return craftrl("train", TINY, f"output_root={root}"), root


@pytest.mark.ray
def test_train_runs_a_tiny_config_end_to_end(tiny_run: tuple[subprocess.CompletedProcess, Path]):
    result, root = tiny_run
    assert result.returncode == 0, result.stderr[-3000:]
    runs = list(root.iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("tiny-")
    run = runs[0]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["train_config"]["save_path"] == str(run / "checkpoints")
    assert (run / "config_source.py").read_text() == Path(TINY).read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/version"] for r in records] == [1.0, 2.0]
    assert (run / "checkpoints" / "iter_00000002" / "state.pt").is_file()
    assert list((run / "tensorboard").iterdir())
    assert f"run directory: {run}" in result.stdout


def test_overrides_may_follow_an_option():
    """``craftrl train CONFIG --resume latest train_config.num_iterations=600``: argparse alone ends a command's
    positionals at its first option and refuses what follows."""
    result = craftrl("train", SEED, "--address", "auto", "train_config.learnin_rate=0.1")
    assert result.returncode == 2
    assert "train_config.learnin_rate: unknown key; did you mean learning_rate?" in result.stderr, result.stderr
    result = craftrl("train", SEED, "--address", "auto", "--bogus")
    assert result.returncode == 2 and "unrecognized arguments: --bogus" in result.stderr
    result = craftrl("eval", "some/run", "train_config.learning_rate=0.1")
    assert result.returncode == 2 and "unrecognized arguments: train_config.learning_rate=0.1" in result.stderr


def test_joining_auto_where_no_cluster_runs_is_one_line_and_creates_no_run_directory(tmp_path: Path):
    # RAY_TMPDIR: where 'auto' looks for a running cluster; this test's own, so no other test's Ray is found
    environment = {**os.environ, "RAY_TMPDIR": str(tmp_path / "ray")}
    result = subprocess.run([sys.executable, "-m", "craftrl.cli.main", "train", TINY, f"output_root={tmp_path / 'runs'}",
                             "--address", "auto"], capture_output=True, text=True, timeout=120, env=environment)
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    assert "no Ray cluster runs on this machine to join at 'auto'; start one (ray start --head" in line
    assert not (tmp_path / "runs").exists(), "bad input creates nothing"


def test_a_ray_client_address_is_one_line_pointing_to_the_head_or_a_job(tmp_path: Path, monkeypatch, capsys):
    """Through Ray Client the run's actors run on the cluster and write its outputs on the head's disk, under paths
    of the client's machine, where the driver reads none of them: craftrl train and a launcher both refuse it."""
    result = subprocess.run([sys.executable, "-m", "craftrl.cli.main", "train", TINY, f"output_root={tmp_path / 'runs'}",
                             "--address", "ray://127.0.0.1:10001"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    assert "the address 'ray://127.0.0.1:10001' goes through Ray Client, which craftrl does not support" in line
    assert "ray job submit" in line and not (tmp_path / "runs").exists()

    monkeypatch.syspath_prepend(str(TESTS / "config_fixtures"))
    from tiny import env_generator, policy_generator, tiny_online

    from craftrl import start_rolloutmanager

    with pytest.raises(SystemExit) as stopped:
        start_rolloutmanager(policy_generator, env_generator, tiny_online(tmp_path), address="ray://head:10001")
    assert stopped.value.code == 2
    assert "the address 'ray://head:10001' goes through Ray Client" in capsys.readouterr().err


def test_train_on_a_machine_without_gpus_says_which_keys_to_change(tmp_path: Path):
    result = craftrl("train", SEED, f"output_root={tmp_path}")
    assert result.returncode == 2
    assert "set rollout_config.num_gpus_per_worker and train_config.num_gpus_per_worker to 0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.ray
def test_eval_and_plot_work_on_a_trained_run(tiny_run: tuple[subprocess.CompletedProcess, Path], tmp_path: Path):
    result, root = tiny_run
    assert result.returncode == 0, result.stderr[-3000:]
    run = next(root.iterdir())
    assert (run / "curve.png").is_file(), "training writes its learning curve"
    video = tmp_path / "eval.mp4"
    result = craftrl("eval", str(run), "--episodes", "2", "--video", str(video), "--deterministic")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "iteration 2, version 2" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert [row[1:3] for row in rows] == [["6.00", "6"], ["6.00", "6"]]  # scripted env: 6 steps, reward 1 each
    import imageio.v2 as imageio

    assert len(imageio.mimread(str(video))) == 2 * 7  # reset frame + 6 steps, per episode
    out = tmp_path / "curves.png"
    plotted = craftrl("plot", str(run), str(run), "--out", str(out))
    assert plotted.returncode == 0 and out.stat().st_size > 10_000


PROJECT_FILES = {
    "my_envs.py": "from craftrl.testing.scripted_env import ScriptedEnv\n\n"
                  "def make_env():\n    return ScriptedEnv(episode_length=6)\n",
    "my_policies.py": "from craftrl.policies import default_policy_generator\n\n"
                      "def make_policy():\n    return default_policy_generator(**{tiny_policy!r})\n",
    "my_config.py": "def env_generator():\n    from my_envs import make_env\n    return make_env()\n\n"
                    "def policy_generator():\n    from my_policies import make_policy\n    return make_policy()\n\n"
                    "online_dict = {online!r}\n",
}


@pytest.mark.ray
def test_a_config_imports_the_modules_beside_it_in_every_process_of_a_run(tmp_path: Path):
    """``craftrl train project/my_config.py`` from another directory, as the console script: the env processes of
    the rollout workers import my_envs and the train worker my_policies, both beside the config; ``craftrl eval``
    of the run, from a third directory, imports them beside the original config, not its saved copy."""
    from config_fixtures.tiny import TINY_POLICY, tiny_online

    project, elsewhere, runs = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "runs"
    project.mkdir()
    elsewhere.mkdir()
    for name, text in PROJECT_FILES.items():
        (project / name).write_text(text.format(tiny_policy=TINY_POLICY, online=tiny_online(tmp_path)))
    console_script = str(Path(sys.executable).parent / "craftrl")
    trained = subprocess.run([console_script, "train", str(project / "my_config.py"), f"output_root={runs}"],
                             cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run,) = runs.iterdir()
    evaluated = subprocess.run([console_script, "eval", str(run), "--episodes", "1"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "iteration 2, version 2" in evaluated.stdout


def test_eval_of_something_that_is_not_a_checkpoint_is_one_clear_error(tmp_path: Path):
    result = craftrl("eval", str(tmp_path))
    assert result.returncode == 2
    assert "no checkpoint here" in result.stderr and "Traceback" not in result.stderr
    result = craftrl("plot", str(tmp_path))
    assert result.returncode == 2 and "no metrics.jsonl" in result.stderr


MINESTUDIO_LAUNCHER = f"""
import sys
sys.path.insert(0, {str(TESTS / "config_fixtures")!r})
from craftrl import start_rolloutmanager, start_trainer
from tiny import env_generator, online_dict, policy_generator

start_rolloutmanager(policy_generator, env_generator, online_dict)
start_trainer(policy_generator, env_generator, online_dict, open({TINY!r}).read())
"""


@pytest.mark.ray
def test_eval_finds_the_checkpoints_of_a_minestudio_launchers_run_beside_the_launcher(tmp_path: Path):
    """A MineStudio launcher's relative save_path resolves against its working directory, outside the run
    directory: `craftrl eval <run directory>` finds them through the run's config.yaml."""
    (tmp_path / "launcher.py").write_text(MINESTUDIO_LAUNCHER)
    launched = subprocess.run([sys.executable, "launcher.py"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert not (run / "checkpoints").exists() and (tmp_path / "checkpoints" / "iter_00000002").is_dir()
    assert (run / "config_dir.txt").read_text() == f"{tmp_path.resolve()}\n"  # the launcher's own modules
    result = craftrl("eval", str(run), "--episodes", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{tmp_path / 'checkpoints' / 'iter_00000002'} (iteration 2, version 2)" in result.stdout


def test_a_train_workers_policy_error_is_one_whole_line_though_ray_train_cuts_its_text():
    """Ray Train cuts a worker's error text in the middle for its message; the exception it keeps is whole."""
    from ray.train import WorkerGroupError

    from craftrl.cli.train import _run_failure
    from craftrl.policies.checks import PolicyContractError

    reason = "policy_generator built another network in train worker 0 than in the driver (" + "x" * 2000 + ")"
    cut = f"[Rank 0 Error Snippet]:\nPolicyContractError: {reason[:500]}...\n... (Output truncated) ...\n"
    assert _run_failure(WorkerGroupError(cut, {0: PolicyContractError(reason)})) == f"train: {reason}"
