"""Configuration: the typed ``online_dict`` schema, loading from module/file/YAML, overrides, docs."""
from craftrl.config.loading import LoadedConfig, apply_overrides, config_to_yaml, load_config
from craftrl.config.schema import OnlineConfig
from craftrl.config.validate import ConfigError, build_config

__all__ = ["ConfigError", "LoadedConfig", "OnlineConfig", "apply_overrides", "build_config", "config_to_yaml",
           "load_config"]
