"""Config loading: files, overrides, and rejection of unknown keys and bad combinations."""

from __future__ import annotations

from pathlib import Path

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
                                "collector.infra_retries=0", "tasks.include=[hello, git]"])
    assert config.sandbox.memory_mb == 2048
    assert config.collector.infra_retries == 0
    assert config.tasks.include == ["hello", "git"]


@pytest.mark.parametrize("overrides, message", [
    (["nope.key=1"], "nope: unknown key"),
    (["sandbox.warm_pool=-1"], "sandbox.warm_pool"),
    (["inference.backend=vllm"], "inference.backend: unknown key"),
    (["inference.engine=sglang"], "inference.engine"),
    (["collector.n_samples_per_task=0"], "n_samples_per_task"),
    (["justtext"], "section.key=value"),
])
def test_rejections_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_budgets_follow_where_the_model_runs():
    """Unset budgets are small for the embedded CPU model and large for an endpoint; a budget
    the user sets wins either way."""
    embedded = load_config()
    remote = load_config(None, ["inference.endpoint=http://127.0.0.1:9"])
    assert embedded.agent.max_turns < remote.agent.max_turns
    assert embedded.inference.max_tokens < remote.inference.max_tokens
    assert embedded.agent.max_context_tokens < remote.agent.max_context_tokens
    chosen = load_config(None, ["agent.max_turns=3", "inference.max_tokens=77",
                                "inference.endpoint=http://127.0.0.1:9"])
    assert (chosen.agent.max_turns, chosen.inference.max_tokens) == (3, 77)
    assert load_config(None, ["agent.max_turns=70"]).agent.max_turns == 70


def test_every_config_field_is_read_somewhere():
    """A field no code reads is a promise the config does not keep."""
    import pathlib

    from pydantic import BaseModel

    import skyrl_agent

    source = "\n".join(p.read_text() for p in pathlib.Path(skyrl_agent.__file__).parent.rglob(
        "*.py") if p.name != "config.py")
    unread = []

    def visit(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            kind = field.annotation
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                visit(kind, f"{prefix}{name}.")
            elif f".{name}" not in source and f"{name}=" not in source:
                unread.append(prefix + name)

    visit(RunConfig, "")
    assert unread == []


def test_configs_are_frozen():
    config = load_config()
    with pytest.raises(ValidationError, match="frozen"):
        config.sandbox.backend = "docker"


def test_garbled_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[sandbox\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(bad)


def test_group_advantages_need_groups_of_two():
    from skyrl_agent.jobs.checks import check_trainable

    with pytest.raises(ConfigError, match="n_samples_per_task >= 2"):
        check_trainable(load_config(None, ["trainer.advantage=rloo"]))
    check_trainable(load_config(None, ["collector.n_samples_per_task=2"]))


def test_trainer_settings_become_the_loss_and_the_optimizer():
    from skyrl_agent.backends.build import adam_params
    from skyrl_agent.backends.loss import parse_loss_config
    from skyrl_agent.rl.step import loss_config

    config = load_config(None, ["trainer.loss_fn=gspo", "trainer.correction=icepop",
                                "trainer.grad_clip_norm=0.5", "agent.max_turns=3",
                                "inference.max_tokens=10"])
    loss = loss_config(config)
    assert (loss.correction, loss.dual_clip, loss.norm_len) == ("icepop", None, 30.0)
    assert adam_params(config.trainer).grad_clip_norm == 0.5
    with pytest.raises(ValueError, match="clip_hgh"):
        parse_loss_config({"clip_hgh": 0.3})  # Tinker callers send mappings: typos are caught


def test_typed_values_are_not_reparsed_and_set_overrides_win():
    """A command's options go in as values: text that reads as a number or a date stays text,
    a path stays a path; `--set` overrides still come after them and win."""
    config = load_config(None, ["agent.name=answer"],
                         {"tasks.source": "2024", "agent.name": "oracle", "output_dir": Path("1e3"),
                          "inference.endpoint": None, "inference.model": "2024-01-01"})
    assert config.tasks.source == "2024"
    assert config.output_dir == Path("1e3")
    assert config.inference.model == "2024-01-01"
    assert config.inference.endpoint is None
    assert config.agent.name == "answer"


def test_routing_replay_on_vllm_without_a_gpu_is_one_line_before_anything_loads(monkeypatch):
    """vLLM returns routed experts only from its Model Runner V2, which needs Triton (CUDA):
    a training run that would start vLLM on a CPU with routing replay stops at validation,
    before its trainer or servers load; on a GPU it passes."""
    from skyrl_agent.inference.vllm import launch
    from skyrl_agent.jobs.checks import check_trainable, check_vllm_routing

    monkeypatch.setattr(launch, "detect_device", lambda: "cpu")
    replay = ["inference.engine=vllm", "trainer.routing_replay=true",
              "collector.n_samples_per_task=2"]
    with pytest.raises(ConfigError, match="needs a GPU: vLLM returns routed experts only from "
                                          "its Model Runner V2, which needs Triton") as refused:
        check_trainable(load_config(None, replay))
    assert "\n" not in str(refused.value)
    monkeypatch.setattr(launch, "detect_device", lambda: "cuda")
    check_vllm_routing()


def test_a_config_file_wins_over_trains_defaults_and_options_win_over_the_file(tmp_path):
    """`train`'s defaults (answer on toy, groups of 8) sit beneath the file: a file naming
    another agent or group size was overridden by them while they lived in the CLI."""
    from skyrl_agent.jobs.train import train_settings

    file = tmp_path / "run.yaml"
    file.write_text("agent:\n  name: terminus\ncollector:\n  n_samples_per_task: 4\n")
    none = dict.fromkeys(["agent.name", "tasks.source", "output_dir"])
    from_file = train_settings(file, None, none, resume=False)
    assert (from_file.agent.name, from_file.collector.n_samples_per_task) == ("terminus", 4)
    assert from_file.tasks.source == "toy" and from_file.output_dir.name.startswith("train-")
    bare = train_settings(None, None, none, resume=False)
    assert (bare.agent.name, bare.collector.n_samples_per_task) == ("answer", 8)
    given = train_settings(file, ["collector.n_samples_per_task=6"],
                           {**none, "agent.name": "openhands"}, resume=False)
    assert (given.agent.name, given.collector.n_samples_per_task) == ("openhands", 6)


def test_a_model_is_resolved_once_per_process_and_cache(tmp_path, monkeypatch):
    """The run's checks, backend and server all ask for the model: the first answer holds (a
    built-in model found converted stays found), and another cache is another resolution."""
    from skyrl_agent.model.names import SMOLLM2, resolve_model

    monkeypatch.setenv("SKYRL_AGENT_CACHE", str(tmp_path / "cache"))
    converted = tmp_path / "cache" / "models" / SMOLLM2
    converted.mkdir(parents=True)
    (converted / "model.safetensors").write_bytes(b"")
    assert resolve_model(SMOLLM2) == converted
    (converted / "model.safetensors").unlink()
    assert resolve_model(SMOLLM2) == converted  # not looked up again
    monkeypatch.setenv("SKYRL_AGENT_CACHE", str(tmp_path / "other"))
    other = tmp_path / "other" / "models" / SMOLLM2
    other.mkdir(parents=True)
    (other / "model.safetensors").write_bytes(b"")
    assert resolve_model(SMOLLM2) == other
