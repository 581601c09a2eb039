"""The embedded server as a real process with SmolLM2-135M, driven over HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl_agent.inference.bounds import (
    MAX_LOGPROBS,
    MAX_MESSAGES,
    MAX_N,
    MAX_PROMPT_CHUNKS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOOLS,
)
from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.process import ServerProcess, embedded_server
from tests.inference_helpers import max_abs_diff, teacher_forced_logprobs

pytestmark = pytest.mark.slow
QUESTIONS = ["What is the capital of France?", "Name three colors.", "Write a haiku about rain.",
             "What is 12 times 12?", "Give me a word that rhymes with cat."]


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory):
    """The folder the module's server may load weights from (as a Tinker server's data dir)."""
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def served(smollm2_dir, weights_dir):
    with embedded_server("smollm2-135m", max_batch_size=64,
                         weights_dirs=[weights_dir]) as process:
        yield process


@pytest.fixture(scope="module")
def server(served):
    return served.url


@pytest.fixture(scope="module")
def control_key(served):
    return served.api_key


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(smollm2_dir)


def post(url: str, path: str, body: bytes | dict, key: str | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def test_openai_sdk_chat_and_completions(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["smollm2-135m"]
    chat = client.chat.completions.create(
        model="smollm2-135m", temperature=0, max_tokens=20,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in chat.choices[0].message.content
    assert chat.choices[0].finish_reason == "stop" and chat.usage.completion_tokens > 0
    completion = client.completions.create(model="smollm2-135m", prompt="The capital of France is",
                                           max_tokens=5, temperature=0, logprobs=2)
    choice = completion.choices[0]
    assert "Paris" in choice.text and len(choice.logprobs.token_logprobs) == 5
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    tools = [{"type": "function", "function": {"name": "finish", "description": "Stop.",
                                               "parameters": {"type": "object"}}}]
    with_tools = client.chat.completions.create(
        model="smollm2-135m", max_tokens=5, tools=tools, logprobs=True, top_logprobs=1,
        messages=[{"role": "user", "content": "hi"}])
    assert len(with_tools.choices[0].logprobs.content) == with_tools.usage.completion_tokens


def test_fifty_samples_are_token_exact(server, reference):
    model, tokenizer = reference
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    status, reply = post(server, "/v1/completions", {
        "prompt": prompts, "temperature": 1.0, "max_tokens": 24, "n": 10, "logprobs": 0,
        "return_token_ids": True, "seed": 1})  # five prompts x 10 samples, batched together
    assert status == 200, reply
    samples = 0
    for index, prompt in enumerate(prompts):
        for choice in reply["choices"][index * 10 : (index + 1) * 10]:
            assert choice["prompt_token_ids"] == prompt
            ids = choice["token_ids"]
            assert tokenizer.decode(ids, skip_special_tokens=True) == choice["text"]
            expected = teacher_forced_logprobs(model, prompt, ids)
            assert max_abs_diff(choice["logprobs"]["token_logprobs"], expected) < 1e-3
            samples += 1
    assert samples == 50


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "invalid JSON"),
    ({"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ({"prompt": "hi", "max_token": 3}, 400, "unknown field 'max_token'"),
    ({"prompt": [1] * 9000, "max_tokens": 1}, 400, "context is 8192"),
    ({"prompt": [1] * 8000, "max_tokens": 500}, 400, "exceed"),
    ({"prompt": [10 ** 9], "max_tokens": 1}, 400, "outside the vocabulary"),
    ({"prompt": "hi", "model": "gpt-4"}, 404, "does not exist"),
    ({"prompt": "hi", "stream": True}, 400, "streaming is not supported"),
])
def test_bad_requests_get_clear_4xx_and_the_server_stays_up(server, body, status, words):
    code, reply = post(server, "/v1/completions", body)
    assert code == status and words in reply["error"]["message"], reply
    assert urllib.request.urlopen(f"{server}/health").status == 200


def test_bad_control_and_chat_requests(server, control_key):
    assert post(server, "/pause?mode=sideways", {}, control_key)[0] == 400
    code, reply = post(server, "/update_weights", {"path": "/nonexistent.safetensors",
                                                   "version": 1}, control_key)
    assert code == 400 and "refusing" in reply["error"]["message"]
    code, reply = post(server, "/v1/chat/completions", {"messages": []})
    assert code == 400 and "messages" in reply["error"]["message"]
    assert post(server, "/v1/models/none", {})[0] in (404, 405)


def test_unknown_model_path_is_one_clear_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "skyrl_agent.inference.server", "--model",
                             str(tmp_path / "missing-model"), "--port", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "unknown model" in result.stderr and "Traceback" not in result.stderr


def test_tokenize_detokenize_and_metrics(server, reference):
    _, tokenizer = reference
    code, reply = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and reply["tokens"] == chat_ids(tokenizer, "hi")
    code, reply = post(server, "/detokenize", {"tokens": reply["tokens"]})
    assert code == 200 and "hi" in reply["prompt"]
    before = _metrics(server)
    post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
    after = _metrics(server)
    assert after["skyrl_inference_requests_total"] == before["skyrl_inference_requests_total"] + 1
    assert (after["skyrl_inference_generation_tokens_total"]
            == before["skyrl_inference_generation_tokens_total"] + 3)
    assert {"skyrl_inference_queue_length", "skyrl_inference_batch_size",
            "skyrl_inference_tokens_per_second"} <= set(after)


def _metrics(server: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{server}/metrics").read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if not s.labels}


async def test_pause_keep_update_resume_with_eight_generations(server, control_key, reference,
                                                               weights_dir):
    model, tokenizer = reference
    original = model.state_dict()["model.norm.weight"].clone()
    zero_norm = weights_dir / "zero-norm.safetensors"  # uniform next-token distribution
    save_file({"model.norm.weight": torch.zeros_like(original)}, zero_norm)
    restore = weights_dir / "restore.safetensors"
    save_file({"model.norm.weight": original}, restore)
    uniform = -math.log(len(tokenizer))
    async with InferenceClient([server], api_keys=[control_key]) as client:
        sampling = Sampling(max_tokens=96, temperature=1.0, ignore_eos=True)
        prompts = [chat_ids(tokenizer, f"Tell a long story about dragon number {i}.")
                   for i in range(8)]
        # The server is shared by the module: count from here, so all 8 are mid-generation.
        base = _metrics(server)["skyrl_inference_generation_tokens_total"]
        tasks = [asyncio.create_task(client.complete(p, sampling, session_id=f"s{i}"))
                 for i, p in enumerate(prompts)]
        await _wait_for_tokens(server, base + 8 * 4)
        await client.pause("keep")
        assert await client.is_paused()
        seconds = await client.update_weights(str(zero_norm), 1)
        assert seconds[0] > 0
        await client.resume()
        outputs = await asyncio.gather(*tasks)
        fresh = await client.complete(prompts[0], Sampling(max_tokens=8))
        await client.update_weights(str(restore), 2)
    mixed = 0
    for out in outputs:
        versions = out.token_policy_versions
        assert len(versions) == len(out.token_ids) == len(out.logprobs)
        assert list(versions) == sorted(versions) and set(versions) <= {0, 1}
        for version, logprob in zip(versions, out.logprobs, strict=True):
            if version == 1:  # sampled by the new (uniform) weights
                assert abs(logprob - uniform) < 1e-3
        mixed += 0 in versions and 1 in versions
    assert mixed >= 1, "no generation spanned the weight update"
    assert all(len(out.token_ids) == 96 for out in outputs)
    assert all(abs(lp - uniform) < 1e-3 for lp in fresh.logprobs)
    assert fresh.token_policy_versions == (1,) * len(fresh.token_ids)


async def _wait_for_tokens(server: str, count: int) -> None:
    for _ in range(600):
        if _metrics(server)["skyrl_inference_generation_tokens_total"] >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("generation did not start")


async def test_abort_pause_is_invisible_to_the_client(server, control_key, reference):
    model, tokenizer = reference
    prompt = chat_ids(tokenizer, "Count from one to one hundred in words.")
    async with InferenceClient([server], api_keys=[control_key], pause_poll_s=0.05) as client:
        base = _metrics(server)["skyrl_inference_generation_tokens_total"]
        task = asyncio.create_task(client.complete(prompt, Sampling(max_tokens=40, seed=5)))
        await _wait_for_tokens(server, base + 5)
        await client.pause("abort")
        await asyncio.sleep(0.3)
        assert not task.done()
        await client.resume()
        out = await task
    assert out.finish_reason in ("stop", "length") and out.token_ids
    expected = teacher_forced_logprobs(model, prompt, out.token_ids)
    assert max_abs_diff(out.logprobs, expected) < 1e-3
    assert tokenizer.decode(list(out.token_ids), skip_special_tokens=True) == out.text


# ---- issue 28: authenticated control and bounded requests ------------------------------------

def test_control_routes_refuse_callers_without_the_run_key(server, control_key):
    """Stops an agent that reaches the port from stalling every generation (/pause) or swapping
    the policy's weights: control routes need the key the run made; generation stays open."""
    for path, body in [("/pause?mode=keep", {}), ("/resume", {}),
                       ("/update_weights", {"path": "/dev/null", "version": 9})]:
        assert post(server, path, body)[0] == 401, path
        assert post(server, path, body, "wrong-" + control_key)[0] == 401, path
    paused = json.loads(urllib.request.urlopen(f"{server}/is_paused").read())
    assert paused == {"is_paused": False}
    assert post(server, "/pause?mode=keep", {}, control_key) == (
        200, {"is_paused": True, "mode": "keep"})
    assert post(server, "/resume", {}, control_key)[0] == 200
    assert post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1})[0] == 200


def test_update_weights_reads_only_files_in_the_weights_folders(server, control_key, weights_dir,
                                                                reference, tmp_path):
    """Stops a key holder from mapping any host file (/etc/shadow, a symlink planted in the
    weights folder) and from probing which paths exist: every refusal reads the same."""
    outside = tmp_path / "outside.safetensors"
    save_file({"model.norm.weight": torch.ones(576)}, outside)
    (weights_dir / "link.safetensors").symlink_to(outside)
    (weights_dir / "sub").mkdir()
    (weights_dir / "sub" / "up").symlink_to(tmp_path)
    refused = [str(outside), "/etc/passwd", "/no/such/file.safetensors",
               str(weights_dir / "link.safetensors"),
               str(weights_dir / "sub/up/outside.safetensors"),
               f"{weights_dir}/../{tmp_path.name}/outside.safetensors", "relative.safetensors"]
    messages = set()
    for path in refused:
        code, reply = post(server, "/update_weights", {"path": path, "version": 3}, control_key)
        assert code == 400, (path, reply)
        messages.add(reply["error"]["message"].replace(repr(path), "PATH"))
    assert len(messages) == 1, messages
    inside = weights_dir / "sub" / "same.safetensors"  # the served weights: later tests unchanged
    save_file({"model.norm.weight": reference[0].state_dict()["model.norm.weight"]}, inside)
    code, reply = post(server, "/update_weights", {"path": str(inside), "version": 0},
                       control_key)
    assert code == 200, reply


BOUNDED = [("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                     "max_tokens": 1})]


@pytest.mark.parametrize("path, body, words", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "seed": 2**80}, "seed"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "seed": -1}, "seed"),
    ("/v1/completions", {"prompt": ["hi"] * 5, "max_tokens": 1, "n": 64}, "at most 256"),
    ("/tokenize", {"prompt": "a " * 600_000}, "at most 1048576"),
    ("/v1/completions", {"prompt": "a " * 600_000, "max_tokens": 1}, "at most 1048576"),
    ("/tokenize", {"messages": [{"role": "user", "content": "a " * 600_000}]}, "at most"),
    *[(path, {**body, **field}, words) for path, body in BOUNDED for field, words in [
        ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "at most 16 stop strings"),
        ({"stop": "x" * (MAX_STOP_CHARS + 1)}, "at most 16 stop strings"),
        ({"stop_token_ids": [2] * (MAX_STOP_TOKEN_IDS + 1)}, "at most 64 stop_token_ids"),
        ({"n": MAX_N + 1}, "n: Input should be less than or equal to 64"),
        ({"logit_bias": {"2": 5}}, "unknown field 'logit_bias'"),
    ]],
    ("/v1/completions", {"prompt": "hi", "logprobs": MAX_LOGPROBS + 1}, "logprobs"),
    ("/v1/completions", {"prompt_chunks": [{"tokens": [1]}] * (MAX_PROMPT_CHUNKS + 1)},
     "at most 65 items"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "logprobs": True, "top_logprobs": MAX_LOGPROBS + 1},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]
                              * (MAX_MESSAGES + 1)}, "at most 4096 items"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "tools": [{}] * (MAX_TOOLS + 1)}, "at most 256 items"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)},
     "at most 4096 items"),
])
@pytest.mark.serial
def test_each_request_bound_answers_4xx_at_once(server, path, body, words):
    """Stops one request from holding the server: 200 prompts x n=64 took 98 s of CPU, 8 MB to
    /tokenize grew the server by 560 MiB, and seed=2**80 ran 17 s into an HTTP 500; 2.5 M
    stop_token_ids or 300,000 stop strings, checked after every sampled token, made an 8-token
    request beside them 5-11x slower. Every field at bound + 1 (inference/bounds.py)."""
    started = time.monotonic()
    code, reply = post(server, path, body)
    assert code == 400 and words in reply["error"]["message"], reply
    assert time.monotonic() - started < 5


def test_a_request_at_every_bound_is_served(server):
    """The bounds refuse only what is past them: a request with every list field at its bound
    is answered."""
    stops = {"stop": [chr(65 + i) * MAX_STOP_CHARS for i in range(MAX_STOP_STRINGS)],
             "stop_token_ids": list(range(10, 10 + MAX_STOP_TOKEN_IDS))}
    code, reply = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 4, **stops,
                                                   "logprobs": MAX_LOGPROBS, "n": 2})
    assert code == 200 and len(reply["choices"]) == 2, reply
    assert len(reply["choices"][0]["logprobs"]["top_logprobs"][0]) == MAX_LOGPROBS
    code, reply = post(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **stops,
        "logprobs": True, "top_logprobs": MAX_LOGPROBS})
    assert code == 200, reply


def _tiny_server(model_dir, env: dict[str, str]) -> ServerProcess:
    argv = [sys.executable, "-m", "skyrl_agent.inference.server", "--model", str(model_dir),
            "--port", "0"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SKYRL_AGENT_")}
    return ServerProcess(argv, env={**clean, "HF_HUB_OFFLINE": "1", **env})


def test_serve_api_key_guards_every_route_and_without_keys_control_is_off(tiny_model_dir):
    """Stops a served model from being driven by whoever reaches it: with SKYRL_AGENT_API_KEY
    (or --api-key) every route but /health needs the key, as vLLM's --api-key does; with no key
    at all, generation is open but pause / resume / update_weights are refused."""
    key = "k-" + "x" * 40
    with _tiny_server(tiny_model_dir, {"SKYRL_AGENT_API_KEY": key}) as guarded:
        url = guarded.url
        assert urllib.request.urlopen(f"{url}/health").status == 200
        for path in ("/v1/completions", "/tokenize", "/pause", "/v1/models", "/metrics"):
            assert post(url, path, {"prompt": "hi", "max_tokens": 1})[0] == 401, path
        assert post(url, "/v1/completions", {"prompt": "hi", "max_tokens": 1}, key)[0] == 200
        assert post(url, "/pause?mode=keep", {}, key)[0] == 200
        assert post(url, "/resume", {}, key)[0] == 200
        assert key not in guarded.log_path.read_text()
    with _tiny_server(tiny_model_dir, {}) as open_server:
        url = open_server.url
        assert post(url, "/v1/completions", {"prompt": "hi", "max_tokens": 1})[0] == 200
        code, reply = post(url, "/pause?mode=keep", {}, "any-key")
        assert code == 401 and "--api-key" in reply["error"]["message"]
