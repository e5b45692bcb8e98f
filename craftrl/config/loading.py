"""Load a config the way MineStudio users write them, plus YAML, plus ``key.path=value`` overrides.

A config is either

* a Python module (dotted name, or a path to a ``.py`` file) that exports ``env_generator``,
  ``policy_generator`` and ``online_dict`` -- MineStudio's contract; or
* a YAML file with ``env_generator`` / ``policy_generator`` naming callables by import path
  (``package.module:function``, or ``{target: ..., kwargs: {...}}`` for a partial) and an ``online_dict``.

The source text of the file is kept (MineStudio's ``whole_config``) so a run directory records exactly what
was run. The config module is registered with cloudpickle *by value*, whether named by path or by module name: its
generators travel with the module-level values they use, as the driver computed them, so that every worker
builds what the driver built (a worker on another node has that node's environment variables, docs/cluster.md);
and a ``.py`` file is not importable by name in env processes or Ray workers at all.

A config imports the modules beside it as a script does (``from my_env import MyEnv``, a file next to
``my_config.py``): its directory goes first on the import path, and a module name is looked up from the working
directory first, as ``python -m`` does. ``LoadedConfig.code_dir`` names that directory, so that Ray's workers and
the env processes they start can import the same modules.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from craftrl.config.schema import OnlineConfig
from craftrl.config.validate import ConfigError, build_config, resolve_field, to_plain


@dataclass
class LoadedConfig:
    """Everything a run needs from a config source."""

    env_generator: Callable[[], Any]
    policy_generator: Callable[[], Any]
    online: OnlineConfig
    source_text: str
    origin: str
    code_dir: str  # where the config's own modules are imported from (absolute)


def load_config(spec: str, overrides: Iterable[str] = (), code_dir: str | Path | None = None) -> LoadedConfig:
    """Load ``spec`` (module name, ``.py`` path or ``.yaml`` path), apply overrides, validate.

    ``code_dir`` is where the config's own modules are imported from: by default the config file's directory, or
    the working directory for a module name (a run directory's saved copy of a config passes the original's).
    """
    is_file = spec.endswith((".py", ".yaml", ".yml"))
    code_dir = str(Path(code_dir or (Path(spec).parent if is_file else Path.cwd())).resolve())
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    if spec.endswith((".yaml", ".yml")):
        env_gen, policy_gen, online_dict, text = _load_yaml(spec)
    else:
        env_gen, policy_gen, online_dict, text = _load_python(spec)
    raw = to_plain(online_dict) if online_dict is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError([f"{spec}: online_dict: expected a dict, got {type(raw).__name__}"])
    raw = apply_overrides(raw, overrides)
    for name, generator in (("env_generator", env_gen), ("policy_generator", policy_gen)):
        check_generator(name, generator, where=spec)
    return LoadedConfig(env_gen, policy_gen, build_config(raw), text, spec, code_dir)


def check_generator(name: str, generator: Any, where: str = "config") -> None:
    """A generator must be callable with no arguments (MineStudio's contract)."""
    if not callable(generator):
        raise ConfigError([f"{where}: {name}: expected a callable taking no arguments, got {generator!r}"])
    try:
        inspect.signature(generator).bind()
    except TypeError as error:  # "missing a required argument: 'checkpoint_path'"
        function = generator.func if isinstance(generator, functools.partial) else generator
        what = f"functools.partial({getattr(function, '__name__', function)}, ...)" \
            if function is not generator else repr(getattr(generator, "__name__", generator))
        raise ConfigError([f"{where}: {name}: expected a callable taking no arguments, but {what} needs arguments "
                           f"({error}); bind them with functools.partial"]) from None
    except ValueError:
        pass  # builtins without a signature: trust them


def _load_python(spec: str) -> tuple[Any, Any, Any, str]:
    path = Path(spec)
    if spec.endswith(".py"):
        if not path.is_file():
            raise ConfigError([f"{spec}: config file not found"])
        module_name = "craftrl_user_config_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[module_name]
            raise ConfigError([f"{spec}: importing the config failed: {type(error).__name__}: {error}"]) from None
        _register_by_value(module)
        text = path.read_text()
    else:
        try:
            module = importlib.import_module(spec)
        except ModuleNotFoundError as error:
            raise ConfigError([f"{spec}: no such config module or file ({error})"]) from None
        except Exception as error:
            raise ConfigError([f"{spec}: importing the config failed: {type(error).__name__}: {error}"]) from None
        _register_by_value(module)
        try:
            text = inspect.getsource(module)
        except (OSError, TypeError):
            text = ""
    missing = [name for name in ("env_generator", "policy_generator", "online_dict") if not hasattr(module, name)]
    if missing:
        raise ConfigError([f"{spec}: the config must define {', '.join(missing)}"])
    return module.env_generator, module.policy_generator, module.online_dict, text


def _register_by_value(module: Any) -> None:
    """Env processes use cloudpickle, Ray uses its vendored copy: both must ship this module by value."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    try:
        import ray.cloudpickle
    except ImportError:  # pragma: no cover - ray is a dependency
        return
    ray.cloudpickle.register_pickle_by_value(module)


def _load_yaml(spec: str) -> tuple[Any, Any, Any, str]:
    path = Path(spec)
    if not path.is_file():
        raise ConfigError([f"{spec}: config file not found"])
    text = path.read_text()
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError([f"{spec}: not valid YAML: {_yaml_problem(error)}"]) from None
    if not isinstance(document, dict):
        raise ConfigError([f"{spec}: expected a mapping with env_generator, policy_generator, online_dict"])
    unknown = set(document) - {"env_generator", "policy_generator", "online_dict"}
    if unknown:
        raise ConfigError([f"{spec}: {sorted(unknown)[0]}: unknown top-level key; expected env_generator, "
                           "policy_generator, online_dict"])
    generators = []
    for name in ("env_generator", "policy_generator"):
        if name not in document:
            raise ConfigError([f"{spec}: {name}: missing; expected an import path like 'package.module:function'"])
        generators.append(resolve_callable(document[name], f"{spec}: {name}"))
    return generators[0], generators[1], document.get("online_dict") or {}, text


def _yaml_problem(error: Exception) -> str:
    """``expected ',' or '}', but got '<stream end>' at line 3, column 1``: what is wrong, and where."""
    problem, mark = getattr(error, "problem", None), getattr(error, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(error).splitlines()[0]


def resolve_callable(entry: Any, where: str) -> Callable[..., Any]:
    """``'pkg.mod:func'`` / ``'pkg.mod.func'`` or ``{target: ..., kwargs: {...}}`` -> a callable."""
    kwargs = {}
    if isinstance(entry, dict):
        if set(entry) - {"target", "kwargs"} or "target" not in entry:
            raise ConfigError([f"{where}: expected {{target: 'pkg.mod:func', kwargs: {{...}}}}, got {entry!r}"])
        kwargs = entry.get("kwargs") or {}
        entry = entry["target"]
    if not isinstance(entry, str) or not entry:
        raise ConfigError([f"{where}: expected an import path like 'package.module:function', got {entry!r}"])
    module_name, _, attribute = entry.partition(":") if ":" in entry else entry.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError([f"{where}: cannot import {entry!r} ({error})"]) from None
    return functools.partial(target, **kwargs) if kwargs else target


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a copy of ``raw``; values are parsed as YAML and typed by the schema."""
    result = _deep_copy(raw)
    for override in overrides:
        path, sep, text = override.partition("=")
        path = path.strip()
        if not sep or not path:
            raise ConfigError([f"override {override!r}: expected key.path=value"])
        value = _parse_value(path, text)
        node = result
        parts = path.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError([f"{path}: cannot override inside {part!r}, which is not a section"])
            node = child
        node[parts[-1]] = value
    return result


def _parse_value(path: str, text: str) -> Any:
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    resolved = resolve_field(path)
    if resolved is not None and isinstance(value, str):
        declared = resolved[0]
        # YAML 1.1 reads '1e-3' as a string; the schema knows the key wants a number.
        if "float" in str(declared):
            try:
                return float(value)
            except ValueError:
                pass
        if value.lower() in ("none", "null", "~"):
            return None
    return value


def _deep_copy(raw: Any) -> Any:
    if isinstance(raw, dict):
        return {key: _deep_copy(value) for key, value in raw.items()}
    if isinstance(raw, list):
        return [_deep_copy(value) for value in raw]
    return raw


def config_to_dict(config: OnlineConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_to_yaml(config: OnlineConfig) -> str:
    return yaml.safe_dump(config_to_dict(config), sort_keys=False)
