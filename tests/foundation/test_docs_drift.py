"""docs/config.md is generated from the schema; this fails whenever the two differ."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from craftrl.config.docs import render
from craftrl.config.schema import OnlineConfig
from craftrl.config.validate import field_type

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_docs_config_md_matches_the_schema():
    assert DOCS.read_text() == render(), "docs/config.md is stale: run `make docs`"


def _all_paths(section_type, prefix=""):
    for spec in dataclasses.fields(section_type):
        declared = field_type(section_type, spec.name)
        if dataclasses.is_dataclass(declared):
            yield from _all_paths(declared, f"{prefix}{spec.name}.")
        else:
            yield f"{prefix}{spec.name}", spec


def test_every_key_has_a_one_line_meaning_and_appears_in_the_docs():
    text = render()
    for path, spec in _all_paths(OnlineConfig):
        doc = spec.metadata.get("doc", "")
        assert doc and "\n" not in doc, f"{path} needs a one-line meaning"
        assert f"`{path}`" in text


def test_the_yaml_example_in_docs_config_md_is_a_valid_config(tmp_path: Path):
    from craftrl.config import load_config

    text = DOCS.read_text()
    start = text.index("```yaml\n") + len("```yaml\n")
    (tmp_path / "my_config.yaml").write_text(text[start:text.index("\n```", start)])
    loaded = load_config(str(tmp_path / "my_config.yaml"))
    assert loaded.online.train_config.num_iterations == 300 and loaded.online.logger_config.name == "my-cows"
    env = loaded.env_generator()
    assert env.task_metrics == ("cows_killed",)
    env.close()
    assert type(loaded.policy_generator().encoder).__name__ == "TileEncoder"
