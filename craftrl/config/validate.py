"""Turn a user's ``online_dict`` (dict, OmegaConf or YAML data) into a typed ``OnlineConfig``, or say exactly why not.

Every problem is reported as one line naming the dotted key path, the offending value and what was
expected; unknown keys come with the closest valid name. All problems are collected before raising so a
user fixes a config in one round trip.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Mapping

from craftrl.config.schema import OnlineConfig


class ConfigError(ValueError):
    """A configuration problem; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def to_plain(data: Any) -> Any:
    """Accept OmegaConf containers (MineStudio passes ``OmegaConf.create(online_dict)``) as plain data."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return data
    if isinstance(data, (DictConfig, ListConfig)):
        return OmegaConf.to_container(data, resolve=True)
    return data


def build_config(data: Mapping[str, Any] | None) -> OnlineConfig:
    """Validate ``data`` against the schema; raise ``ConfigError`` listing every problem."""
    if isinstance(data, OnlineConfig):
        data = dataclasses.asdict(data)
    data = to_plain(data) if data is not None else {}
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise ConfigError([f"online_dict: expected a mapping of config keys, got {type(data).__name__}"])
    config = _build_section(OnlineConfig, data, "", problems)
    if not problems:
        problems.extend(cross_field_problems(config))
    if problems:
        raise ConfigError(problems)
    return config


def field_type(section_type: type, name: str) -> Any:
    return typing.get_type_hints(section_type)[name]


def resolve_field(path: str) -> tuple[Any, dataclasses.Field] | None:
    """The (declared type, field) at a dotted path, or None when the path is not in the schema."""
    section_type: Any = OnlineConfig
    parts = path.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(section_type)}
        if part not in fields:
            return None
        declared = field_type(section_type, part)
        if i == len(parts) - 1:
            return declared, fields[part]
        if not dataclasses.is_dataclass(declared):
            return None
        section_type = declared
    return None


def _build_section(section_type: type, data: Mapping[str, Any], prefix: str, problems: list[str]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(section_type)}
    for name in data:
        if name not in fields:
            path = f"{prefix}{name}"
            words = sorted(str(name).split("_"))
            same_words = [field for field in fields if sorted(field.split("_")) == words]
            hint = same_words or difflib.get_close_matches(str(name), list(fields), n=1, cutoff=0.6)
            suggestion = f"; did you mean {hint[0]}?" if hint else f"; valid keys here: {', '.join(fields)}"
            problems.append(f"{path}: unknown key{suggestion}")
    values: dict[str, Any] = {}
    for name, spec in fields.items():
        path = f"{prefix}{name}"
        declared = field_type(section_type, name)
        if dataclasses.is_dataclass(declared):
            raw = data.get(name, {})
            if raw is None:
                raw = {}
            if not isinstance(raw, Mapping):
                problems.append(f"{path}: expected a mapping (a section of keys), got {raw!r}")
                continue
            values[name] = _build_section(declared, raw, f"{path}.", problems)
            continue
        if name not in data:
            continue  # the dataclass default applies
        value, error = _coerce(data[name], declared)
        if error:
            problems.append(f"{path}: expected {error}, got {data[name]!r}")
            continue
        check = spec.metadata.get("check")
        if value is not None and check is not None and not check(value):
            problems.append(f"{path}: expected {check.expect}, got {value!r}")
            continue
        values[name] = value
    return section_type(**values)


def _coerce(value: Any, declared: Any) -> tuple[Any, str | None]:
    """Check ``value`` against a declared type; ints are accepted where floats are declared."""
    optional = False
    origin = typing.get_origin(declared)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(declared) if a is not type(None)]
        optional = len(args) < len(typing.get_args(declared))
        if len(args) > 1:  # one of several types: the first that takes the value
            if value is None and optional:
                return None, None
            for arg in args:
                coerced, error = _coerce(value, arg)
                if error is None:
                    return coerced, None
            return None, " or ".join(_type_name(arg) for arg in args) + (" or null" if optional else "")
        declared = args[0]
    if value is None:
        return (None, None) if optional else (None, _type_name(declared))
    expect = _type_name(declared) + (" or null" if optional else "")
    if declared is bool:
        return (value, None) if isinstance(value, bool) else (None, expect)
    if declared is int:
        return (value, None) if isinstance(value, int) and not isinstance(value, bool) else (None, expect)
    if declared is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
        return None, expect
    if declared is str:
        return (value, None) if isinstance(value, str) else (None, expect)
    if typing.get_origin(declared) is dict:  # resource name -> amount
        if isinstance(value, Mapping) and all(
                isinstance(name, str) and isinstance(amount, (int, float)) and not isinstance(amount, bool)
                and amount >= 0 for name, amount in value.items()):
            return {name: float(amount) for name, amount in value.items()}, None
        return None, expect
    return value, None


def _type_name(declared: Any) -> str:
    if typing.get_origin(declared) is dict:
        return "a mapping of names to non-negative numbers"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(declared, str(declared))


def cross_field_problems(config: OnlineConfig) -> list[str]:
    """Constraints that involve several keys; each message names the key to change."""
    problems = []
    worker = config.rollout_config.worker_config
    if worker.batch_size > worker.num_envs:
        problems.append(
            f"rollout_config.worker_config.batch_size: expected <= worker_config.num_envs ({worker.num_envs}), "
            f"got {worker.batch_size}; a forward pass cannot batch more envs than the worker owns"
        )
    if worker.envs_per_process > worker.num_envs:
        problems.append(
            f"rollout_config.worker_config.envs_per_process: expected <= worker_config.num_envs ({worker.num_envs}), "
            f"got {worker.envs_per_process}"
        )
    elif worker.envs_per_process > 1 and worker.restart_interval:
        problems.append(
            f"rollout_config.worker_config.restart_interval: expected None or 0 when envs_per_process > 1 "
            f"(it is {worker.envs_per_process}), got {worker.restart_interval:g}; recycling one env's process "
            "would cut the episodes of the other envs in it"
        )
    train = config.train_config
    if train.save_interval and train.keep_interval and train.keep_interval % train.save_interval:
        problems.append(
            f"train_config.keep_interval: expected a multiple of save_interval ({train.save_interval}), "
            f"got {train.keep_interval}; otherwise the checkpoints it keeps are never written"
        )
    if train.vf_warmup >= train.num_iterations:
        problems.append(
            f"train_config.vf_warmup: expected < num_iterations ({train.num_iterations}), got {train.vf_warmup}; "
            "the policy would never be trained"
        )
    if train.resources_per_worker and train.num_workers == 0:
        problems.append(
            "train_config.resources_per_worker: expected train_config.num_workers >= 1, got num_workers=0; in "
            "local mode the learner runs in the driver, which Ray does not place"
        )
    fragment_length = config.rollout_config.fragment_length
    if train.minibatch_sequence_length and fragment_length % train.minibatch_sequence_length:
        problems.append(
            f"train_config.minibatch_sequence_length: expected a divisor of rollout_config.fragment_length "
            f"({fragment_length}), got {train.minibatch_sequence_length}; fragments are cut into equal sequences"
        )
    if train.enable_ref_update and train.kl_divergence_coef_rho == 0:
        problems.append("train_config.enable_ref_update: needs kl_divergence_coef_rho > 0, got 0; without the KL "
                        "term there is no reference policy to update")
    if train.resume == "":
        problems.append("train_config.resume: expected a checkpoint path, 'latest' or null, got ''")
    rollout, buffer = config.rollout_config, config.rollout_config.replay_buffer_config
    sync = rollout.synchronous_sampling
    chunks_per_batch = train.batch_size_per_gpu / buffer.fragments_per_chunk
    if train.batch_size_per_gpu % buffer.fragments_per_chunk:
        problems.append(
            f"train_config.batch_size_per_gpu: expected a multiple of replay_buffer_config.fragments_per_chunk "
            f"({buffer.fragments_per_chunk}), got {train.batch_size_per_gpu}; batches are made of whole chunks"
        )
    elif chunks_per_batch * max(train.num_workers, 1) > buffer.max_chunks:
        problems.append(
            f"rollout_config.replay_buffer_config.max_chunks: expected >= the chunks one batch needs "
            f"({int(chunks_per_batch * max(train.num_workers, 1))}), got {buffer.max_chunks}"
        )
    else:
        per_iteration = config.chunks_per_iteration()
        if buffer.max_unsampled_chunks and not per_iteration <= buffer.max_unsampled_chunks <= buffer.max_chunks:
            problems.append(
                f"rollout_config.replay_buffer_config.max_unsampled_chunks: expected 0 or between the chunks one "
                f"iteration samples ({per_iteration}) and max_chunks ({buffer.max_chunks}), got "
                f"{buffer.max_unsampled_chunks}; fewer would hold back the rollouts a sample waits for"
            )
        envs, fragments = rollout.worker_config.num_envs * rollout.num_rollout_workers, config.fragments_per_iteration()
        if sync and fragments % envs:
            problems.append(
                f"rollout_config.synchronous_sampling: expected the fragments of one iteration "
                f"({fragments}) to split evenly over the {envs} envs of all rollout "
                "workers; change worker_config.num_envs, num_rollout_workers or the train batch"
            )
    if sync and buffer.max_reuse != 1:
        problems.append(
            f"rollout_config.synchronous_sampling: needs replay_buffer_config.max_reuse 1, got {buffer.max_reuse}; "
            "a chunk sampled again was acted by an older version, and the trainer would take it instead of waiting "
            "for the new one"
        )
    if sync and train.vf_warmup:
        problems.append(
            f"rollout_config.synchronous_sampling: needs train_config.vf_warmup 0, got {train.vf_warmup}; "
            "warm-up iterations publish no new version for the envs to wait for"
        )
    return problems
