from __future__ import annotations

from types import SimpleNamespace

import pytest

from craftrl.replay.config import BufferSettings, StoreSettings, buffer_settings_from


def test_settings_from_a_mapping_or_an_object_with_the_schema_keys():
    section = {"max_chunks": 10, "max_reuse": 3, "max_staleness": 0, "fragments_per_report": 5,
               "fragments_per_chunk": 2, "database_config": {"path": "/tmp/x", "num_shards": 4}}
    settings = buffer_settings_from(section, seed=7)
    assert settings == BufferSettings(10, 3, 0, 5, 2, StoreSettings("/tmp/x", 4), seed=7)
    as_object = SimpleNamespace(**{**section, "database_config": SimpleNamespace(path="/tmp/x", num_shards=4)})
    assert buffer_settings_from(as_object, seed=7) == settings
    assert settings.max_live_fragments == 10 * 2 * (1 + settings.read_grace_samples)


@pytest.mark.parametrize("section, name", [
    ({"max_reuse": 0}, "replay_buffer_config.max_reuse"),
    ({"fragments_per_chunk": "2"}, "replay_buffer_config.fragments_per_chunk"),
    ({"database_config": {"num_shards": 0}}, "database_config.num_shards"),
    ({"database_config": {"path": ""}}, "database_config.path"),
])
def test_bad_values_name_the_key(section, name):
    with pytest.raises(ValueError, match=name):
        buffer_settings_from(section)
