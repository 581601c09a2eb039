"""Config loading: files, overrides, and rejection of unknown keys and bad combinations."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from skyrl_agent.config import RunConfig, load_config
from skyrl_agent.errors import ConfigError


def test_defaults_are_valid():
    config = load_config()
    assert config == RunConfig()
    assert config.sandbox.backend == "local"


def test_yaml_and_toml_files(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("sandbox:\n  backend: docker\n  pids_limit: 100\ncollector:\n"
                         "  n_samples_per_task: 8\n")
    toml_file = tmp_path / "run.toml"
    toml_file.write_text('[sandbox]\nbackend = "docker"\npids_limit = 100\n'
                         '[collector]\nn_samples_per_task = 8\n')
    assert load_config(yaml_file) == load_config(toml_file)
    assert load_config(yaml_file).collector.n_samples_per_task == 8


def test_overrides_apply_in_order_and_coerce_types(tmp_path):
    config = load_config(None, ["sandbox.memory_mb=1024", "sandbox.memory_mb=2048",
                                "trainer.max_staleness=0", "tasks.include=[hello, git]"])
    assert config.sandbox.memory_mb == 2048
    assert config.trainer.max_staleness == 0
    assert config.tasks.include == ["hello", "git"]


@pytest.mark.parametrize("overrides, message", [
    (["nope.key=1"], "nope: unknown key"),
    (["sandbox.warm_pool=-1"], "sandbox.warm_pool"),
    (["inference.backend=openai"], "needs inference.endpoint"),
    (["collector.n_samples_per_task=1"], "at least 2"),
    (["justtext"], "section.key=value"),
])
def test_rejections_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_configs_are_frozen():
    config = load_config()
    with pytest.raises(ValidationError, match="frozen"):
        config.sandbox.backend = "docker"


def test_garbled_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[sandbox\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(bad)
