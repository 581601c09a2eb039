"""The generation engine in-process, on a tiny random Llama: batching, sampling, pause, weights."""

from __future__ import annotations

import asyncio

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl_agent.inference.server.engine import Engine
from skyrl_agent.inference.server.prefix_cache import PrefixCache
from skyrl_agent.inference.server.sampling import SamplingParams, choose, make_generator
from skyrl_agent.inference.server.weights import WeightUpdateError, load_weights
from tests.inference_helpers import max_abs_diff, teacher_forced_logprobs

PROMPTS = [[1, 504, 3575, 282, 4649, 314], [1, 22, 23], list(range(100, 140)), [7, 8, 9, 10, 11]]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
async def engine(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, max_batch_size=8, prefix_cache_tokens=0)
    engine.start()
    yield engine
    engine.close()


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, **kw)


async def test_concurrent_rows_match_teacher_forcing(engine, tiny):
    model, _ = tiny
    sampled = SamplingParams(max_tokens=20, temperature=1.0, seed=3, ignore_eos=True)
    results = await asyncio.gather(*[engine.generate(p, sampled, n=2) for p in PROMPTS])
    assert engine.stats().generation_tokens_total == 8 * 20
    for prompt, outputs in zip(PROMPTS, results, strict=True):
        for out in outputs:
            assert len(out.token_ids) == 20 and out.finish_reason == "length"
            reference = teacher_forced_logprobs(model, prompt, out.token_ids)
            assert max_abs_diff(out.logprobs, reference) < 1e-4


async def test_logprobs_at_other_temperatures_are_of_the_raw_distribution(engine, tiny):
    """Stops: the engine reporting logprobs after temperature scaling. Whatever the sampling
    temperature, a token's logprob is the model's own (temperature 1), as teacher forcing
    recomputes it."""
    model, _ = tiny
    for temperature in (0.5, 1.7):
        params = SamplingParams(max_tokens=12, temperature=temperature, seed=5, ignore_eos=True)
        (out,) = await engine.generate(PROMPTS[0], params)
        reference = teacher_forced_logprobs(model, PROMPTS[0], out.token_ids)
        assert max_abs_diff(out.logprobs, reference) < 1e-4, temperature


async def test_batched_greedy_equals_solo(engine, tiny):
    model, tokenizer = tiny
    solo_engine = Engine(model, tokenizer, max_batch_size=1, prefix_cache_tokens=0)
    solo_engine.start()
    try:
        solo = [(await solo_engine.generate(p, greedy(12)))[0] for p in PROMPTS]
    finally:
        solo_engine.close()
    batched = await asyncio.gather(*[engine.generate(p, greedy(12)) for p in PROMPTS])
    for one, many in zip(solo, batched, strict=True):
        assert one.token_ids == many[0].token_ids
        assert max_abs_diff(one.logprobs, many[0].logprobs) < 1e-4


async def test_seed_reproduces_and_samples_differ(engine):
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=11, ignore_eos=True)
    first = await engine.generate(PROMPTS[0], params, n=3)
    again = await engine.generate(PROMPTS[0], params, n=3)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert len({o.token_ids for o in first}) == 3


async def test_stop_string_cuts_text_but_keeps_ids(engine, tiny):
    _, tokenizer = tiny
    free = (await engine.generate(PROMPTS[1], greedy(12)))[0]
    stop_at = tokenizer.decode(free.token_ids[4:6], skip_special_tokens=True)
    assert stop_at.strip(), "the random model produced only blank tokens"
    out = (await engine.generate(PROMPTS[1], greedy(12, stop=(stop_at,))))[0]
    assert out.finish_reason == "stop"
    assert stop_at not in out.text and free.text.startswith(out.text)
    assert out.token_ids == free.token_ids[: len(out.token_ids)]


async def test_pause_keep_freezes_and_resume_continues(engine):
    task = asyncio.create_task(engine.generate(PROMPTS[2], greedy(300)))
    while engine.stats().generation_tokens_total < 5:
        await asyncio.sleep(0.01)
    await engine.pause("keep")
    frozen = engine.stats().generation_tokens_total
    await asyncio.sleep(0.3)
    assert engine.stats().generation_tokens_total == frozen and engine.stats().running == 1
    assert not task.done()
    await engine.resume()
    out = (await task)[0]
    assert len(out.token_ids) == 300 and out.finish_reason == "length"


async def test_pause_wait_drains_and_abort_returns_partial(engine):
    task = asyncio.create_task(engine.generate(PROMPTS[0], greedy(40)))
    while engine.stats().generation_tokens_total < 2:
        await asyncio.sleep(0.01)
    await engine.pause("wait")
    assert engine.stats().running == 0  # drained before the pause returned
    assert len((await asyncio.wait_for(task, timeout=1))[0].token_ids) == 40
    await engine.resume()
    task = asyncio.create_task(engine.generate(PROMPTS[0], greedy(400)))
    while engine.stats().running == 0:
        await asyncio.sleep(0.01)
    await engine.pause("abort")
    out = (await task)[0]
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < 400
    queued = asyncio.create_task(engine.generate(PROMPTS[0], greedy(3)))
    await asyncio.sleep(0.2)
    assert not queued.done(), "a request sent during a pause must wait for resume"
    await engine.resume()
    assert len((await queued)[0].token_ids) == 3


async def test_cancelled_request_frees_its_rows(engine):
    task = asyncio.create_task(engine.generate(PROMPTS[2], greedy(400)))
    while engine.stats().running == 0:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if engine.stats().running == 0:
            break
        await asyncio.sleep(0.02)
    assert engine.stats().running == 0


async def test_prefix_cache_gives_same_logprobs(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, prefix_cache_tokens=10_000)
    engine.start()
    try:
        first = (await engine.generate(PROMPTS[2], greedy(10)))[0]
        follow_up = PROMPTS[2] + list(first.token_ids) + [5, 6, 7]
        second = (await engine.generate(follow_up, greedy(10)))[0]
    finally:
        engine.close()
    assert second.cached_prompt_tokens == len(PROMPTS[2]) + 10 - 1
    reference = teacher_forced_logprobs(model, follow_up, second.token_ids)
    assert max_abs_diff(second.logprobs, reference) < 1e-4


async def test_weight_update_changes_outputs_and_version(tiny, tmp_path):
    model, tokenizer = tiny
    original = {k: v.clone() for k, v in model.state_dict().items()}
    engine = Engine(model, tokenizer, prefix_cache_tokens=0)
    engine.start()
    try:
        zero_norm = tmp_path / "zero-norm.safetensors"
        save_file({"model.norm.weight": torch.zeros_like(original["model.norm.weight"])},
                  zero_norm)
        seconds = await engine.update_weights(str(zero_norm), 5)
        assert seconds >= 0 and engine.policy_version == 5
        out = (await engine.generate(PROMPTS[0], SamplingParams(max_tokens=4, seed=0)))[0]
        # A zero final norm makes every logit 0: the distribution is uniform over the vocab.
        uniform = -torch.log(torch.tensor(float(len(tokenizer)))).item()
        assert max_abs_diff(out.logprobs, [uniform] * 4) < 1e-4
        assert out.policy_versions == (5, 5, 5, 5)
    finally:
        engine.close()
        model.load_state_dict(original)


def test_bad_weight_files_leave_the_model_alone(tiny, tmp_path):
    model, _ = tiny
    before = model.model.norm.weight.clone()
    wrong_shape = tmp_path / "shape.safetensors"
    save_file({"model.norm.weight": torch.zeros(3)}, wrong_shape)
    unknown = tmp_path / "unknown.safetensors"
    save_file({"model.norm.weight": torch.zeros_like(before), "no.such": torch.zeros(1)}, unknown)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    for path, message in [(wrong_shape, "shape"), (unknown, "not in the model"),
                          (garbage, "cannot read"), (tmp_path / "missing", "not found")]:
        with pytest.raises(WeightUpdateError, match=message):
            load_weights(model, path)
    assert torch.equal(model.model.norm.weight, before)


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([[5.0, 4.0, 1.0, 0.0, -1.0]])
    for params, allowed in [(SamplingParams(max_tokens=1, top_k=2), {0, 1}),
                            (SamplingParams(max_tokens=1, top_p=0.5), {0}),
                            (SamplingParams(max_tokens=1, temperature=0), {0})]:
        generator = make_generator(0)
        seen = {choose(logits, [params], [generator])[0].token_id for _ in range(200)}
        assert seen == allowed, params
    choice = choose(logits, [SamplingParams(max_tokens=1, logprobs=2)], [make_generator(0)])[0]
    assert [t for t, _ in choice.top] == [0, 1]
    assert choice.logprob == pytest.approx(float(torch.log_softmax(logits, -1)[0, choice.token_id]))


def test_choose_reports_raw_logprobs_at_any_temperature():
    """Stops: logprobs (sampled and top alternatives) taken after temperature scaling."""
    logits = torch.tensor([[5.0, 4.0, 1.0, 0.0, -1.0]])
    raw = torch.log_softmax(logits, -1)[0].tolist()
    for temperature in (0, 0.5, 3.0):
        params = SamplingParams(max_tokens=1, temperature=temperature, logprobs=2)
        generator = make_generator(0)
        for _ in range(30):
            choice = choose(logits, [params], [generator])[0]
            assert choice.logprob == pytest.approx(raw[choice.token_id]), temperature
            assert [t for t, _ in choice.top] == [0, 1]
            assert [lp for _, lp in choice.top] == pytest.approx(raw[:2]), temperature


def test_prefix_cache_lru_and_longest_match():
    cache = PrefixCache(max_tokens=100, min_match=2)
    kv = [(torch.zeros(1, 1, 40, 2), torch.zeros(1, 1, 40, 2))]
    cache.store(list(range(40)), kv)
    cache.store(list(range(10)), [(t[:, :, :10], t[:, :, :10]) for t, _ in kv])  # covered: skipped
    matched, layers, _ = cache.lookup([*range(30), 99])
    assert matched == 30 and layers[0][0].shape[2] == 30
    assert cache.lookup(list(range(40)))[0] == 39  # the last prompt token always runs
    assert cache.lookup([99, 98, 97])[0] == 0
    cache.store(list(range(100, 170)), [(torch.zeros(1, 1, 70, 2),) * 2])  # evicts the oldest
    assert cache.lookup(list(range(30)))[0] == 0


async def test_a_failed_prefill_fails_only_its_own_request(engine):
    running = asyncio.create_task(engine.generate(PROMPTS[2], greedy(60)))
    while engine.stats().running == 0:
        await asyncio.sleep(0.01)
    with pytest.raises(RuntimeError, match="prefill failed"):
        await engine.generate([10**9], greedy(3))  # not in the vocabulary: the forward fails
    assert len((await running)[0].token_ids) == 60
