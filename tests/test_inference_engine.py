"""The generation engine in-process, on a tiny random Llama: batching, sampling, pause, weights."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import DynamicCache

from skyrl_agent.inference.server.engine import Engine
from skyrl_agent.inference.server.kv import KVBatch
from skyrl_agent.inference.server.kv_budget import KVBudgetExceeded, kv_bytes_per_token
from skyrl_agent.inference.server.prefix_cache import PrefixCache
from skyrl_agent.inference.server.sampling import SamplingParams, choose, make_generator
from skyrl_agent.model.weights.reader import WeightUpdateError, load_weights
from skyrl_agent.types import ChangedWeights
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
        times = await engine.update_weights(str(zero_norm), 5)
        assert times.transfer_s > 0 and times.pause_s > 0 and engine.policy_version == 5
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


async def test_kv_memory_stays_within_its_budget_and_requests_past_it_wait(tiny):
    """Stops: a running batch or prefix cache that grows past `kv_cache_mb` (the server's RSS
    climbing with load). The budget fits three rows of 40 + 24 tokens beside one prompt. Requests
    run one at a time first fill the prefix cache to the budget; then twelve at once ask for
    more than it holds. Every request completes (the rest waited), the KV held after any step,
    measured from the buffers themselves, stays within the budget (the cache made room for the
    batch), and the cache still serves a follow-up turn."""
    model, tokenizer = tiny
    token_bytes = kv_bytes_per_token(model, torch.device("cpu"))
    prompt_len, sampled = 40, 24
    budget_tokens = 3 * (prompt_len + sampled) + prompt_len
    engine = Engine(model, tokenizer, max_batch_size=8, prefix_cache_tokens=100_000,
                    kv_cache_mb=budget_tokens * token_bytes / 2**20)
    engine.start()
    try:
        prompts = [list(range(100 + 50 * i, 100 + 50 * i + prompt_len)) for i in range(12)]
        for prompt in prompts[:6]:
            await engine.generate(prompt, greedy(sampled))
        filled = engine.stats().kv_used_bytes  # nothing runs: all of it is the prefix cache
        lengths = [sampled - 8 * (i % 3) for i in range(12)]  # rows finish at different steps
        firsts = await asyncio.gather(*[engine.generate(p, greedy(n))
                                        for p, n in zip(prompts, lengths, strict=True)])
        (again,) = await engine.generate(prompts[0], greedy(sampled))
        (second,) = await engine.generate(prompts[0] + list(again.token_ids) + [7, 8], greedy(4))
        stats = engine.stats()
        with pytest.raises(KVBudgetExceeded, match="KV cache"):
            await engine.generate(list(range(100, 100 + budget_tokens)), greedy(8))
    finally:
        engine.close()
    assert [len(o[0].token_ids) for o in firsts] == lengths
    assert stats.kv_peak_bytes <= stats.kv_budget_bytes == budget_tokens * token_bytes
    assert filled >= 2 * (prompt_len + sampled - 1) * token_bytes  # the cache used its room
    assert stats.kv_peak_bytes > 2 * prompt_len * token_bytes  # rows did run side by side
    assert second.cached_prompt_tokens == prompt_len + sampled - 1


def test_a_grown_or_rebuilt_batch_never_passes_its_rows_reach():
    """The batch's buffers keep spare room for decoding, but never past max_length tokens a
    row; joining a prefill and selecting rows keep every row's tokens where the mask says."""
    one = DynamicCache()
    keys = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(1, 2, 5, 3)
    one.update(keys, keys + 0.5, 0)
    batch = KVBatch.from_prefill(one, rows=2, max_length=9)
    other = DynamicCache()
    other.update(keys[:, :, :3], keys[:, :, :3] + 0.5, 0)
    batch.add_prefill(other, rows=1, max_length=9)
    assert batch.mask.tolist() == [[1] * 5, [1] * 5, [0, 0, 1, 1, 1]]
    layer = batch.cache.layers[0]
    assert torch.equal(layer.keys[2, :, 2:], keys[0, :, :3])
    assert torch.equal(layer.keys[2, :, :2], torch.zeros(2, 2, 3))
    for _ in range(4):  # decode to the rows' reach: the buffer grows only up to it
        step = torch.ones(3, 2, 1, 3)
        layer.update(step, step)
        batch.append_mask_column()
    assert layer.keys.shape[2] == 9 and batch.nbytes == 2 * 3 * 2 * 9 * 3 * 4
    batch.select([2], max_length=9)
    assert batch.mask.tolist() == [[1] * 7]  # the padding no kept row needs is cut
    assert torch.equal(batch.cache.layers[0].keys[0, :, :3], keys[0, :, :3])


async def test_a_row_growing_into_the_prefix_caches_room_evicts_it_first(tiny):
    """Stops: a decode step that grows the batch's buffers while the prefix cache still holds
    the room it grows into (over the budget, though admission said the row fits)."""
    model, tokenizer = tiny
    token_bytes = kv_bytes_per_token(model, torch.device("cpu"))
    budget_tokens = 200
    engine = Engine(model, tokenizer, prefix_cache_tokens=100_000,
                    kv_cache_mb=budget_tokens * token_bytes / 2**20)
    engine.start()
    try:
        for i in range(5):  # short rows, sequentially: the cache fills up
            await engine.generate(list(range(100 + 30 * i, 120 + 30 * i)), greedy(20))
        filled = engine.stats().kv_used_bytes
        (long,) = await engine.generate(list(range(900, 920)), greedy(150))  # reach 170
        stats = engine.stats()
    finally:
        engine.close()
    assert len(long.token_ids) == 150
    assert filled > (budget_tokens - 170) * token_bytes  # the long row had to take cache room
    assert stats.kv_peak_bytes <= stats.kv_budget_bytes


def test_selecting_rows_never_gives_a_row_more_room_than_it_had():
    """Fewer rows must hold fewer token slots: the retiring step made room for the batch as it
    was, not for kept rows rebuilt with the more spare room a longer row would get anew."""
    one = DynamicCache()
    one.update(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2), 0)
    batch = KVBatch.from_prefill(one, rows=3, max_length=100)
    for _ in range(35):  # 40 columns: within the 64 slots made at 5, short of the 80 a new one gets
        batch.cache.layers[0].update(torch.ones(3, 1, 1, 2), torch.ones(3, 1, 1, 2))
        batch.append_mask_column()
    before = batch.held_tokens()
    batch.select([0, 1], max_length=100)
    assert batch.held_tokens() == 2 * 64 < before


async def test_deltas_land_on_the_weights_they_were_computed_against(tiny, tmp_path):
    """Stops: a delta update staged into the back buffers as they were two versions ago (the
    swap leaves the previous weights there). A full update, then deltas of one tensor, of two
    rows of another, and of the first again: the served weights are all four applied in
    order."""
    model, tokenizer = tiny
    original = {k: v.clone() for k, v in model.state_dict().items()}
    engine = Engine(model, tokenizer, prefix_cache_tokens=0)
    engine.start()
    try:
        expected = {k: v + 0.01 for k, v in original.items()}
        save_file({k: v.contiguous() for k, v in expected.items()
                   if k != "lm_head.weight"}, tmp_path / "v1.safetensors")  # tied: one tensor
        await engine.update_weights(str(tmp_path / "v1.safetensors"), 1)
        expected["model.norm.weight"] = torch.full_like(expected["model.norm.weight"], 0.5)
        save_file({"model.norm.weight": expected["model.norm.weight"]}, tmp_path / "v2.safetensors")
        await engine.update_weights(str(tmp_path / "v2.safetensors"), 2,
                                    ChangedWeights(1, {"model.norm.weight": None}))
        embed = expected["model.embed_tokens.weight"].clone()
        embed[3:5] = -1.0
        expected["model.embed_tokens.weight"] = embed
        save_file({"model.embed_tokens.weight": embed}, tmp_path / "v3.safetensors")
        await engine.update_weights(str(tmp_path / "v3.safetensors"), 3,
                                    ChangedWeights(2, {"model.embed_tokens.weight": (3, 4)}))
        expected["model.norm.weight"] = torch.full_like(expected["model.norm.weight"], 0.25)
        save_file({"model.norm.weight": expected["model.norm.weight"]}, tmp_path / "v4.safetensors")
        await engine.update_weights(str(tmp_path / "v4.safetensors"), 4,
                                    ChangedWeights(3, {"model.norm.weight": None}))
        served = model.state_dict()
        assert all(torch.equal(served[k], expected[k]) for k in expected if k != "lm_head.weight")
    finally:
        engine.close()
        model.load_state_dict(original)


async def test_decoding_goes_on_while_an_update_is_staged(tiny, tmp_path, monkeypatch):
    """Stops: an update that holds the engine (the sampler paused for the whole transfer).
    Staging is slowed to half a second; tokens keep coming meanwhile, and the running row's
    tokens switch version at one step boundary."""
    model, tokenizer = tiny
    original = {k: v.clone() for k, v in model.state_dict().items()}
    engine = Engine(model, tokenizer, prefix_cache_tokens=0)
    engine.start()
    slow_load = engine._weights.load

    def load(*args, **kwargs):
        time.sleep(0.5)
        return slow_load(*args, **kwargs)

    monkeypatch.setattr(engine._weights, "load", load)
    try:
        path = tmp_path / "norm.safetensors"
        save_file({"model.norm.weight": original["model.norm.weight"] * 2}, path)
        running = asyncio.create_task(engine.generate(PROMPTS[0], greedy(400)))
        while engine.stats().generation_tokens_total < 5:
            await asyncio.sleep(0.01)
        updating = asyncio.create_task(engine.update_weights(str(path), 7))
        await asyncio.sleep(0.05)
        during = engine.stats().generation_tokens_total
        times = await updating
        after = engine.stats().generation_tokens_total
        (out,) = await running
    finally:
        engine.close()
        model.load_state_dict(original)
    assert after - during > 10, "no tokens while the update was staged"
    assert times.transfer_s >= 0.5 > times.pause_s
    switch = out.policy_versions.index(7)
    assert set(out.policy_versions[:switch]) == {0} and set(out.policy_versions[switch:]) == {7}


async def test_samples_of_one_request_join_in_parts_when_the_budget_cannot_take_them_all(tiny):
    """Stops: a request for n samples refused (or held forever) because n rows at once pass the
    KV budget though one fits. Five samples under a budget of two rows come back, each the
    same as an unbounded engine samples with the same seed, and the budget holds."""
    model, tokenizer = tiny
    token_bytes = kv_bytes_per_token(model, torch.device("cpu"))
    prompt = PROMPTS[2]
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=21, ignore_eos=True)
    reach = len(prompt) + params.max_tokens
    small = Engine(model, tokenizer, prefix_cache_tokens=0,
                   kv_cache_mb=(2 * reach + len(prompt)) * token_bytes / 2**20)
    large = Engine(model, tokenizer, prefix_cache_tokens=0)
    for engine in (small, large):
        engine.start()
    try:
        parts = await small.generate(prompt, params, n=5)
        whole = await large.generate(prompt, params, n=5)
        stats = small.stats()
    finally:
        for engine in (small, large):
            engine.close()
    assert [o.token_ids for o in parts] == [o.token_ids for o in whole]
    assert max(abs(a - b) for p, w in zip(parts, whole, strict=True)
               for a, b in zip(p.logprobs, w.logprobs, strict=True)) < 1e-4
    assert stats.kv_peak_bytes <= stats.kv_budget_bytes and stats.requests_total == 1


async def test_a_request_with_many_samples_leaves_room_for_others(engine):
    """Stops: one request whose n fills the batch keeping every later request out until its
    samples finish (n at its bound beside an 8-token request: 2.3x the latency alone). One
    request holds at most half the batch, so a short request sent just after it joins at once
    and finishes first; the long one still gets all its samples."""
    long = asyncio.create_task(engine.generate(PROMPTS[2], greedy(60), n=8))
    while engine.stats().running == 0:
        await asyncio.sleep(0.01)
    assert engine.stats().running == engine.row_share == 4
    short = asyncio.create_task(engine.generate(PROMPTS[1], greedy(2)))
    done, _ = await asyncio.wait({long, short}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {short}
    assert [len(o.token_ids) for o in await long] == [60] * 8
