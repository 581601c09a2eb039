"""The Tinker cookbook's recipes, run unmodified as `python -m ...` against `tinker-serve`, on
CPU-sized settings given the way the cookbook takes them (its chz command line).

The recipes load a model's tokenizer and their data sets by hub name; nothing is reachable here,
so the test seeds the caches those loaders read offline: a hub snapshot named
`Qwen/Qwen3-4B-Instruct-2507` holding a tiny Llama with SmolLM2's tokenizer (ChatML, like
Qwen's, so the recipe's own qwen3 renderer works on it), and small `HuggingFaceH4/no_robots`
and `openai/gsm8k` tables in the `datasets` cache. The server serves the same folder under that
name. The tiny model is first taught to answer `\\boxed{5}` or `\\boxed{8}` (half each), so the
RL recipe's rewards differ within a group and it takes real training steps.

Which recipes of tinker-cookbook 0.6.1 run against the server, and why the others do not:
- run (tested here, 6): `recipes/sl_loop.py`; `recipes/sl_basic.py` (the full supervised
  trainer, which also closes its session at the end); `recipes/rl_loop.py` with `loss_fn` set
  to `importance_sampling` or `gspo` (and `cispo`, the same path); `recipes/chat_sl` on
  no_robots; `recipes/math_rl` on its generated arithmetic problems, asynchronous
  (`max_steps_off_policy=1`) with CISPO; `recipes/rl_basic.py`, whose blueprint fixes 128
  problems x 16 samples a step, with its data set builder rebuilt from the command line.
- `rl_loop.py`'s and `math_rl`'s default `loss_fn=stable_reinforce`, and `rubric`: a
  Tinker-internal loss over the sampler's recorded stability data; not implemented (refused).
- `distillation/sdft.py` and off-policy distillation: use `topk_prompt_logprobs`, which the
  server has (tested in test_tinker.py); not run (hub data sets, a teacher model).
- `vlm_classifier`: image chunks are served for vision models (tests/test_tinker_vision.py
  drives them through the SDK), but its image data sets and VLM come from the hub; not run.
- `audio`: audio chunks; refused (text and image chunks only).
- `code_rl`, `harbor_rl`, `search_tool`, `verifiers_rl`: need code sandboxes, a search index or
  outside services; not run.
- The rest (`preference` (DPO through forward_backward_custom, which the server supports),
  on-policy `distillation`, `prompt_distillation`, `multiplayer_rl`, `forecasting`,
  `decisions`, `true_thinking_score`, `rl_numerics_check`): use calls the server has, but each
  needs its own hub data sets or bigger models; not run end to end here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tinker_server import SDK_ENV, _sdk_env, start_server  # noqa: F401

pytest.importorskip("tinker_cookbook")
pytestmark = pytest.mark.slow

MODEL = "Qwen/Qwen3-4B-Instruct-2507"
QUESTIONS = [("What is 2 + 3?", "2 + 3 = 5\n#### 5"), ("What is 4 + 4?", "4 + 4 = 8\n#### 8")]


def _boxed_model(tiny_model_dir: Path, target: Path) -> Path:
    """The tiny model, fully fine-tuned to reply \\boxed{5} or \\boxed{8} to any question."""
    from transformers import AutoTokenizer

    from skyrl_agent.backends.backend import AdamParams, Datum
    from skyrl_agent.backends.torch_backend import TorchBackend

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = []
    for question, _ in QUESTIONS:
        for answer in ("5", "8"):
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                   add_generation_prompt=True, tokenize=False)
            prompt_ids = tokenizer.encode(prompt)
            ids = prompt_ids + tokenizer.encode(f"\\boxed{{{answer}}}<|im_end|>")
            weights = [0.0] * (len(prompt_ids) - 1) + [1.0] * (len(ids) - len(prompt_ids))
            data.append(Datum(tuple(ids[:-1]), {"target_tokens": tuple(ids[1:]),
                                                "weights": tuple(weights)}))
    backend = TorchBackend(tiny_model_dir, seed=0)
    for _ in range(32):
        backend.forward_backward(data, "cross_entropy", {"reduction": "token-mean"})
        backend.optim_step(AdamParams(learning_rate=1e-2))
    backend.export(target)
    backend.close()
    return target


def _seed_hub_model(hub: Path, folder: Path) -> None:
    repo = hub / f"models--{MODEL.replace('/', '--')}"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    shutil.copytree(folder, repo / "snapshots" / revision)


def _seed_dataset(cache: Path, repo: str, config: str, splits: dict[str, dict]) -> None:
    """A `datasets` cache entry that load_dataset(repo, config) finds offline."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    files = {}
    for split, columns in splits.items():
        path = cache / f"{repo.replace('/', '_')}-{split}.parquet"
        pq.write_table(pa.table(columns), path)
        files[split] = str(path)
    name = repo.split("/")[1]
    builder = Parquet(cache_dir=str(cache / "build"), dataset_name=name, config_name=config,
                      data_files=files, hash="seeded")
    builder.download_and_prepare()
    built = Path(builder.cache_dir)  # build/NAME/CONFIG-HASH/0.0.0/seeded
    target = cache / repo.replace("/", "___") / config / "0.0.0" / "seeded"
    target.parent.mkdir(parents=True)
    shutil.move(built, target)


@pytest.fixture(scope="module")
def cookbook_env(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("cookbook")
    folder = _boxed_model(tiny_model_dir, root / "boxed-model")
    _seed_hub_model(root / "hf" / "hub", folder)
    datasets_cache = root / "hf" / "datasets"
    datasets_cache.mkdir(parents=True)
    # 128 rows: sl_basic's data set builder fixes its batch size at 128.
    chats = [[{"role": "user", "content": q}, {"role": "assistant", "content": a}]
             for q, a in QUESTIONS * 64]
    _seed_dataset(datasets_cache, "HuggingFaceH4/no_robots", "default",
                  {"train": {"messages": chats}, "test": {"messages": chats[:2]}})
    _seed_dataset(datasets_cache, "openai/gsm8k", "main",
                  {split: {"question": [q for q, _ in QUESTIONS * 3],
                           "answer": [a for _, a in QUESTIONS * 3]} for split in ("train", "test")})
    server = start_server([f"{MODEL}={folder}"], root / "data", root / "server.log")
    env = {**os.environ, **SDK_ENV, "HF_HOME": str(root / "hf"),
           "HF_HUB_CACHE": str(root / "hf" / "hub"), "HF_DATASETS_CACHE": str(datasets_cache),
           "HF_DATASETS_OFFLINE": "1", "TINKER_API_KEY": server.api_key}
    yield server.url, env, root
    server.stop()


def _run_recipe(module: str, args: list[str], env: dict[str, str], log: Path) -> list[dict]:
    argv = [sys.executable, "-m", module, *args, f"log_path={log}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]


def test_cookbook_sl_loop_runs_unmodified(cookbook_env):
    url, env, root = cookbook_env
    metrics = _run_recipe("tinker_cookbook.recipes.sl_loop",
                          [f"base_url={url}", f"model_name={MODEL}", "batch_size=2",
                           "max_steps=3", "lora_rank=4", "learning_rate=1e-3",
                           "max_length=128", "save_every=2"], env, root / "sl")
    nll = [m["train_mean_nll"] for m in metrics if "train_mean_nll" in m]
    assert len(nll) == 3 and all(v > 0 for v in nll)
    checkpoints = (root / "sl" / "checkpoints.jsonl").read_text()
    assert "tinker://" in checkpoints and "final" in checkpoints


def test_cookbook_sl_basic_runs_unmodified(cookbook_env):
    """The full supervised trainer (supervised/train.py): one step of 128 conversations, a
    final checkpoint, and ServiceClient.close() at the end (the session's models released)."""
    url, env, root = cookbook_env
    metrics = _run_recipe("tinker_cookbook.recipes.sl_basic",
                          [f"base_url={url}", f"model_name={MODEL}", "lora_rank=4",
                           "eval_every=0", "save_every=0"], env, root / "sl-basic")
    assert [m["num_sequences"] for m in metrics if "num_sequences" in m] == [128]
    assert "tinker://" in (root / "sl-basic" / "checkpoints.jsonl").read_text()


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "gspo"])
def test_cookbook_rl_loop_runs_unmodified_and_trains(cookbook_env, loss_fn):
    url, env, root = cookbook_env
    metrics = _run_recipe("tinker_cookbook.recipes.rl_loop",
                          [f"base_url={url}", f"model_name={MODEL}", "batch_size=2",
                           "group_size=8", "max_tokens=8", "max_steps=3", "lora_rank=4",
                           f"loss_fn={loss_fn}", "save_every=0"], env, root / f"rl-{loss_fn}")
    # The cookbook skips a step whose groups all got one reward; groups of 8 over 3 steps make
    # a step with a mixed group all but certain (2 steps of groups of 4 once had none). The
    # data set holds 3 batches.
    assert len(metrics) == 3
    rewards = [m["reward/total"] for m in metrics]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    # optim_step's metrics land in the log only when a training step really ran.
    assert any("learning_rate" in m for m in metrics), metrics


def test_cookbook_chat_sl_runs_unmodified(cookbook_env):
    """recipes/chat_sl: the chat supervised recipe on no_robots, a few conversations a step."""
    url, env, root = cookbook_env
    metrics = _run_recipe("tinker_cookbook.recipes.chat_sl.train",
                          [f"base_url={url}", f"model_name={MODEL}", "lora_rank=4",
                           "batch_size=4", "max_steps=2", "max_length=128", "eval_every=0",
                           "save_every=0", "infrequent_eval_every=0"], env, root / "chat-sl")
    assert [m["num_sequences"] for m in metrics if "num_sequences" in m] == [4, 4]


def test_cookbook_math_rl_runs_unmodified_asynchronously(cookbook_env):
    """recipes/math_rl on its generated arithmetic problems, one step off-policy allowed (the
    cookbook's asynchronous RL), with Tinker's CISPO."""
    url, env, root = cookbook_env
    metrics = _run_recipe("tinker_cookbook.recipes.math_rl.train",
                          [f"base_url={url}", f"model_name={MODEL}", "lora_rank=4",
                           "env=arithmetic", "group_size=4", "groups_per_batch=2",
                           "max_tokens=6", "max_steps=2", "loss_fn=cispo",
                           "max_steps_off_policy=1", "eval_every=0", "save_every=0"],
                          env, root / "math-rl")
    steps = [m for m in metrics if "env/all/reward/total" in m]
    assert len(steps) == 2 and all("optim/lr" in m for m in steps)
    assert all(-1.0 <= m["env/all/reward/total"] <= 1.0 for m in steps)  # format penalty < 0
    assert max(m["async/staleness_max"] for m in steps) <= 1


def test_cookbook_rl_basic_runs_unmodified_with_a_cpu_sized_builder(cookbook_env):
    """recipes/rl_basic fixes 128 problems x 16 samples a step in its blueprint; chz rebuilds
    the data set builder from the command line (the cookbook's own way to set a config), so
    the recipe's code stays as it is."""
    url, env, root = cookbook_env
    builder = "dataset_builder"
    metrics = _run_recipe("tinker_cookbook.recipes.rl_basic",
                          [f"base_url={url}", f"model_name={MODEL}", "lora_rank=4",
                           f"{builder}=tinker_cookbook.recipes.math_rl.math_env:"
                           "Gsm8kDatasetBuilder", f"{builder}.batch_size=2",
                           f"{builder}.group_size=4", f"{builder}.renderer_name=qwen3_instruct",
                           f"{builder}.model_name_for_tokenizer={MODEL}", "max_tokens=8",
                           "max_steps=2"], env, root / "rl-basic")
    steps = [m for m in metrics if "env/all/reward/total" in m]
    assert len(steps) == 2 and all("optim/lr" in m for m in steps)
    assert all(-1.0 <= m["env/all/reward/total"] <= 1.0 for m in steps)  # format penalty < 0
