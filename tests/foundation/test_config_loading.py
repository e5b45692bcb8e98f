"""Configs load from a dotted module, a .py file and YAML; overrides are typed by the schema."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import cloudpickle
import pytest

from craftrl.config import ConfigError, apply_overrides, load_config


def test_dotted_module_loads_generators_dict_and_source():
    loaded = load_config("config_fixtures.seed004")
    assert loaded.online.train_config.num_workers == 2
    assert callable(loaded.env_generator) and callable(loaded.policy_generator)
    assert "online_dict" in loaded.source_text


PY_CONFIG = """
def make_env():
    return {"made_by": __name__}

def env_generator():
    return make_env()

def policy_generator():
    return "policy"

online_dict = {"train_config": {"learning_rate": 0.001}, "rollout_config": {"fragment_length": 32}}
"""


def test_python_file_loads_and_its_generators_pickle_by_value(tmp_path: Path):
    path = tmp_path / "my_config.py"
    path.write_text(PY_CONFIG)
    loaded = load_config(str(path))
    assert loaded.online.train_config.learning_rate == 0.001
    assert loaded.source_text == PY_CONFIG
    # A fresh interpreter (an env process) cannot import the file by name: it must come by value.
    payload = cloudpickle.dumps(loaded.env_generator)
    script = "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read())()['made_by'])"
    result = subprocess.run([sys.executable, "-c", script], input=payload, capture_output=True, cwd="/")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().startswith("craftrl_user_config_")


def test_yaml_config_names_generators_by_import_path(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent("""
        env_generator: config_fixtures.seed004:env_generator
        policy_generator:
          target: builtins.dict
          kwargs: {width: 3}
        online_dict:
          train_config: {num_iterations: 7}
    """))
    loaded = load_config(str(path))
    assert loaded.online.train_config.num_iterations == 7
    assert loaded.policy_generator() == {"width": 3}
    assert loaded.env_generator.__name__ == "env_generator"


@pytest.fixture
def console_script_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The import path as the ``craftrl`` console script has it (its own directory, not the working directory),
    restored afterwards; returns a module-name prefix of this test's own."""
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", os.getcwd())])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return re.sub(r"\W", "_", tmp_path.name)


def _project_beside_its_config(directory: Path, prefix: str) -> None:
    directory.mkdir()
    (directory / f"{prefix}_envs.py").write_text("def make_env():\n    return 'made beside the config'\n")
    (directory / f"{prefix}_config.py").write_text(textwrap.dedent(f"""
        from {prefix}_envs import make_env as _imported_when_loading

        def env_generator():
            from {prefix}_envs import make_env
            return make_env()

        def policy_generator():
            return _imported_when_loading()

        online_dict = {{}}
    """))
    (directory / f"{prefix}_config.yaml").write_text(
        f"env_generator: {prefix}_envs:make_env\npolicy_generator: {prefix}_envs:make_env\n")


@pytest.mark.parametrize("suffix", [".py", ".yaml"])
def test_a_config_file_imports_the_modules_beside_it_from_any_working_directory(
        console_script_path: str, tmp_path: Path, suffix: str):
    """As Python does for a script: ``craftrl train project/my_config.py`` with ``project/my_envs.py`` beside it."""
    project = tmp_path / "project"
    _project_beside_its_config(project, console_script_path)
    loaded = load_config(str(project / f"{console_script_path}_config{suffix}"))
    assert loaded.env_generator() == loaded.policy_generator() == "made beside the config"
    assert loaded.code_dir == str(project.resolve())  # what Ray's workers add to their import path


def test_a_config_module_name_is_found_in_the_working_directory(console_script_path: str, tmp_path: Path):
    """As ``python -m`` does: ``craftrl train my_config`` in the directory holding my_config.py."""
    project = tmp_path / "project"
    _project_beside_its_config(project, console_script_path)
    os.chdir(project)
    loaded = load_config(f"{console_script_path}_config")
    assert loaded.env_generator() == "made beside the config"
    assert loaded.code_dir == str(project.resolve())


@pytest.mark.parametrize("named_by", ["path", "module name"])
def test_a_value_the_config_reads_when_loaded_travels_with_its_generators(
        console_script_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named_by: str):
    """A worker on another node has that node's environment variables (docs/cluster.md): the generators must carry
    what the driver read when it loaded the config, however the config was named, not read it again there."""
    import ray.cloudpickle

    project = tmp_path / "project"
    project.mkdir()
    module = f"{console_script_path}_reads_env"
    (project / f"{module}.py").write_text(textwrap.dedent("""
        import os

        WIDTH = os.environ.get("CRAFTRL_TEST_WIDTH", "unset")

        def policy_generator():
            return WIDTH

        env_generator = policy_generator
        online_dict = {}
    """))
    monkeypatch.setenv("CRAFTRL_TEST_WIDTH", "32")
    os.chdir(project)
    loaded = load_config(str(project / f"{module}.py") if named_by == "path" else module)
    payload = ray.cloudpickle.dumps(loaded.policy_generator)
    # a worker: the config's directory on its import path (as Ray's workers have it), but not the variable
    script = "import pickle, sys; sys.path.insert(0, sys.argv[1]); print(pickle.loads(sys.stdin.buffer.read())())"
    worker_env = {key: value for key, value in os.environ.items() if key != "CRAFTRL_TEST_WIDTH"}
    result = subprocess.run([sys.executable, "-c", script, str(project)], input=payload, capture_output=True,
                            cwd="/", env=worker_env)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip() == "32"


def test_a_saved_copy_of_a_config_imports_from_the_directory_given(console_script_path: str, tmp_path: Path):
    """A run directory's config_source.py imports the modules beside the original (``craftrl eval``)."""
    project = tmp_path / "project"
    _project_beside_its_config(project, console_script_path)
    run = tmp_path / "run"
    run.mkdir()
    saved = run / "config_source.py"
    saved.write_text((project / f"{console_script_path}_config.py").read_text())
    loaded = load_config(str(saved), code_dir=project)
    assert loaded.env_generator() == "made beside the config"


def test_overrides_are_parsed_and_type_checked_like_the_file():
    loaded = load_config("config_fixtures.seed004", [
        "train_config.learning_rate=1e-3",          # YAML 1.1 reads this as a string; the schema wants a float
        "rollout_config.worker_config.num_envs=16",
        "rollout_config.worker_config.restart_interval=null",
        "train_config.anneal_lr_linearly=true",
        "logger_config.name=cows-2",
    ])
    train = loaded.online.train_config
    assert train.learning_rate == pytest.approx(1e-3)
    assert train.anneal_lr_linearly is True
    assert loaded.online.rollout_config.worker_config.num_envs == 16
    assert loaded.online.rollout_config.worker_config.restart_interval is None
    assert loaded.online.logger_config.name == "cows-2"


@pytest.mark.parametrize("override, fragment", [
    ("train_config.learnin_rate=0.1", "did you mean learning_rate?"),
    ("train_config.num_iterations=many", "train_config.num_iterations: expected an integer, got 'many'"),
    ("rollout_config.worker_config.batch_size=100", "batch_size: expected <= worker_config.num_envs (12), got 100"),
    ("no_equals_sign", "expected key.path=value"),
    ("train_config.discount.inner=1", "cannot override inside 'discount'"),
])
def test_bad_overrides_are_rejected(override, fragment):
    with pytest.raises(ConfigError, match=None) as caught:
        load_config("config_fixtures.seed004", [override])
    assert fragment in str(caught.value)


def test_override_does_not_mutate_the_source_dict():
    source = {"train_config": {"learning_rate": 0.1}}
    apply_overrides(source, ["train_config.learning_rate=0.2"])
    assert source == {"train_config": {"learning_rate": 0.1}}


@pytest.mark.parametrize("text, fragment", [
    ("online_dict = {}\ndef policy_generator(): pass\n", "the config must define env_generator"),
    ("def env_generator(size): pass\ndef policy_generator(): pass\nonline_dict = {}\n",
     "env_generator: expected a callable taking no arguments"),
    ("env_generator = 3\ndef policy_generator(): pass\nonline_dict = {}\n", "env_generator: expected a callable"),
    ("raise RuntimeError('boom')\n", "importing the config failed: RuntimeError: boom"),
    ("def env_generator(): pass\ndef policy_generator(): pass\nonline_dict = [1]\n", "online_dict: expected a dict"),
])
def test_broken_python_configs_give_one_clear_error(tmp_path: Path, text, fragment):
    path = tmp_path / "broken.py"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert fragment in str(caught.value)


@pytest.mark.parametrize("text, fragment", [
    ("env_generator: nowhere.module:fn\npolicy_generator: builtins:dict\n", "cannot import 'nowhere.module:fn'"),
    ("policy_generator: builtins:dict\n", "env_generator: missing"),
    ("env_generator: builtins:dict\npolicy_generator: builtins:dict\nextra: 1\n", "extra: unknown top-level key"),
    ("env_generator: [unclosed\n", "not valid YAML: expected ',' or ']', but got '<stream end>' at line 2, column 1"),
    ("online_dict:\n  train_config: {num_iterations: 3\nenv_generator: a:b\n",
     "not valid YAML: expected ',' or '}', but got ':' at line 3, column 14"),
])
def test_broken_yaml_configs_give_one_clear_error(tmp_path: Path, text, fragment):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert fragment in str(caught.value)


def test_missing_config_sources():
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("/nonexistent/config.py")
    with pytest.raises(ConfigError, match="no such config module"):
        load_config("no_such_package.config")
