"""The real `tinker` SDK against `skyrl-agent tinker-serve` (a child process on 127.0.0.1).

The model is a tiny random Llama over a character tokenizer: real code paths (peft LoRA, the
torch backend, the embedded sampler, protobuf both ways) in seconds.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.tinker_server import _sdk_env, start_server  # noqa: F401 - autouse fixture
from tests.tiny_models import char_model_dir

tinker = pytest.importorskip("tinker")
types = tinker.types

SFT_TEXTS = ["the cat sat on the mat.", "a dog ran in the park.", "the sun is hot today.",
             "we like green tea a lot."]


@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    return char_model_dir(tmp_path_factory.mktemp("char-llama"), hidden=32, layers=1)


@pytest.fixture(scope="module")
def server(char_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tinker")
    process = start_server([f"tiny={char_dir}"], folder / "data", folder / "server.log")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def service(server):
    client = tinker.ServiceClient(base_url=server.url, api_key=server.api_key)
    yield client
    client.close("success").result()  # stops its heartbeats before the server goes


def datum(tokens: list[int], **arrays) -> types.Datum:
    """Tinker's layout: the model reads tokens[:-1] and predicts tokens[1:]."""
    inputs = {"target_tokens": np.asarray(tokens[1:], dtype=np.int64)}
    inputs.update({k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()})
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def logprobs_of(client, sequences: list[list[int]]) -> list[np.ndarray]:
    out = client.forward([datum(s) for s in sequences], loss_fn="cross_entropy").result()
    return [o["logprobs"].to_numpy().astype(np.float64) for o in out.loss_fn_outputs]


def test_sdk_trains_every_loss_saves_loads_and_samples_the_trained_weights(service):
    trains_every_loss_saves_loads_and_samples(service)


def test_the_same_through_fsdp_ranks(char_dir, tmp_path):
    """`tinker-serve --backend fsdp`: each LoRA model sharded over two FSDP2 ranks."""
    process = start_server([f"tiny={char_dir}"], tmp_path / "data", tmp_path / "server.log",
                           extra=["--backend", "fsdp", "--data-parallel", "2"])
    try:
        client = tinker.ServiceClient(base_url=process.url, api_key=process.api_key)
        try:
            trains_every_loss_saves_loads_and_samples(client)
        finally:
            client.close("success").result()
    finally:
        process.stop()


def trains_every_loss_saves_loads_and_samples(service) -> None:
    client = service.create_lora_training_client(base_model="tiny", rank=8, seed=1).result()
    assert client.get_info().lora_rank == 8
    tokenizer = client.get_tokenizer()  # the SDK loads it offline from the folder get_info names
    batch = [tokenizer.encode(text) for text in SFT_TEXTS]

    # SFT: the loss falls.
    adam = types.AdamParams(learning_rate=1e-2)
    losses = []
    for _ in range(12):
        step = client.forward_backward([datum(s, weights=[1] * (len(s) - 1)) for s in batch],
                                       "cross_entropy")
        client.optim_step(adam)  # submitted before the first finished: seq_id order
        losses.append(step.result().metrics["loss:sum"])
    assert losses[-1] < 0.96 * losses[0] and losses[-1] < min(losses[1:6]), losses

    # Every RL loss, checked against its formula at ratio 1 (sampler logprobs = current ones).
    seq = batch[0]
    current = logprobs_of(client, [seq])[0]
    advantages = np.where(np.arange(len(seq) - 1) % 2 == 0, 1.0, -0.5)
    rl = [datum(seq, logprobs=current, advantages=advantages)]
    expected = {"importance_sampling": -advantages.sum(), "ppo": -advantages.sum(),
                "gspo": -advantages.sum(), "cispo": -(advantages * current).sum(),
                "dro": -(advantages * current).sum()}
    configs = {"ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28},
               "cispo": {"clip_high_threshold": 1.2}, "dro": {"beta": 0.1}}
    for loss_fn, value in expected.items():
        out = client.forward_backward(rl, loss_fn, configs.get(loss_fn)).result()
        assert out.metrics["loss:sum"] == pytest.approx(value, rel=1e-4, abs=1e-4), loss_fn
        np.testing.assert_allclose(out.loss_fn_outputs[0]["logprobs"].to_numpy(), current,
                                   atol=1e-5)
        assert out.metrics["agreement/max_abs_diff:max"] < 1e-5
    # The KL term (beyond Tinker): adapters off give the reference; after training it is > 0.
    kl = client.forward_backward(rl, "ppo", {"kl_coef": 0.5, "kl_estimator": "k3"}).result()
    assert kl.metrics["kl_ref:mean"] > 0
    assert kl.metrics["loss:sum"] > -advantages.sum()
    client.optim_step(types.AdamParams(learning_rate=0.0)).result()  # drop those gradients

    # save_state / load_state, with and without the optimizer.
    state = client.save_state("s1").result().path
    assert state.startswith("tinker://") and state.endswith("/weights/s1")
    sampler_path = client.save_weights_for_sampler("w1").result().path
    at_save = logprobs_of(client, batch)
    client.forward_backward([datum(s, weights=[1] * (len(s) - 1)) for s in batch],
                            "cross_entropy")
    client.optim_step(adam).result()
    moved = logprobs_of(client, batch)
    assert max(np.abs(a - b).max() for a, b in zip(at_save, moved, strict=True)) > 1e-3
    client.load_state(state).result()
    for a, b in zip(at_save, logprobs_of(client, batch), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    client.load_state_with_optimizer(state).result()
    for a, b in zip(at_save, logprobs_of(client, batch), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)

    # Sampling from the saved weights: sampled and prompt logprobs = a forward of the tokens.
    sampler = service.create_sampling_client(model_path=sampler_path).result()
    prompt = tokenizer.encode("the cat")
    first = _check_sample_matches(client, sampler, prompt)

    # Ephemeral weights after one more step, then the named ones again (the server reloads).
    client.forward_backward([datum(s, weights=[1] * (len(s) - 1)) for s in batch],
                            "cross_entropy")
    client.optim_step(adam).result()
    ephemeral = client.save_weights_and_get_sampling_client().result()
    _check_sample_matches(client, ephemeral, prompt)
    client.load_state(state).result()
    again = _check_sample_matches(client, sampler, prompt)
    assert again.sequences[0].tokens == first.sequences[0].tokens  # same weights, same seed


def _check_sample_matches(client, sampler, prompt):
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    result = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3,
                            sampling_params=params, include_prompt_logprobs=True,
                            topk_prompt_logprobs=3).result()
    assert len(result.sequences) == 3
    _check_topk(result.topk_prompt_logprobs, result.prompt_logprobs, prompt)
    assert len({tuple(s.tokens) for s in result.sequences}) > 1  # seeds differ per sample
    assert result.prompt_logprobs[0] is None  # position 0 has no context (NaN on the wire)
    for seq in result.sequences:
        full = prompt + list(seq.tokens)
        (forward,) = logprobs_of(client, [full])
        np.testing.assert_allclose(np.asarray(seq.logprobs), forward[len(prompt) - 1:],
                                   atol=1e-3)
        np.testing.assert_allclose(np.asarray(result.prompt_logprobs[1:], dtype=np.float64),
                                   forward[: len(prompt) - 1], atol=1e-3)
    return result


def _check_topk(topk, prompt_logprobs, prompt) -> None:
    """The k likeliest next tokens at each prompt position, consistent with the logprob of
    the token that was there: it is at most the best, and equal to its own entry if listed."""
    assert len(topk) == len(prompt) and topk[0] is None
    hits = 0
    for position in range(1, len(prompt)):
        entries = topk[position]
        values = [lp for _, lp in entries]
        assert len(entries) == 3 and values == sorted(values, reverse=True)
        assert np.logaddexp.reduce(values) <= 1e-5  # probabilities sum to at most 1
        actual = prompt_logprobs[position]
        assert actual <= values[0] + 1e-4
        listed = dict(entries)
        if prompt[position] in listed:
            assert listed[prompt[position]] == pytest.approx(actual, abs=1e-4)
            hits += 1
    assert hits > 0  # the trained prompt's own tokens are among the likeliest somewhere


def test_models_on_one_server_are_isolated_and_base_sampling_sees_base_weights(service):
    trained = service.create_lora_training_client(base_model="tiny", rank=4).result()
    untouched = service.create_lora_training_client(base_model="tiny", rank=4).result()
    tokenizer = trained.get_tokenizer()
    seq = tokenizer.encode("isolated models")
    before = logprobs_of(untouched, [seq])[0]
    for _ in range(3):
        trained.forward_backward([datum(seq, weights=[1] * (len(seq) - 1))], "cross_entropy")
        trained.optim_step(types.AdamParams(learning_rate=5e-2))
    after_training = logprobs_of(trained, [seq])[0]
    assert np.abs(after_training - before).max() > 1e-3
    np.testing.assert_allclose(logprobs_of(untouched, [seq])[0], before, atol=1e-6)

    # The trained weights were on the sampler last; a base session must get the base back.
    trained.save_weights_and_get_sampling_client().result().sample(
        types.ModelInput.from_ints(seq[:4]), 1, types.SamplingParams(max_tokens=2)).result()
    base = service.create_sampling_client(base_model="tiny").result()
    result = base.sample(types.ModelInput.from_ints(seq), 1, types.SamplingParams(max_tokens=1),
                         include_prompt_logprobs=True).result()
    np.testing.assert_allclose(np.asarray(result.prompt_logprobs[1:], dtype=np.float64), before,
                               atol=1e-3)


def test_a_batch_the_sdk_splits_into_parallel_chunks_is_applied_in_seq_id_order(service):
    """Over 1,024 datums the SDK sends chunks in parallel, the first chunk last, and the
    optimizer step right behind them: the server must run them in seq_id order."""
    client = service.create_lora_training_client(base_model="tiny", rank=4, seed=5).result()
    reference = service.create_lora_training_client(base_model="tiny", rank=4, seed=5).result()
    sequences = [[10 + i % 50, 11 + i % 40, 12 + i % 30, 13] for i in range(1100)]
    weights = [1.0, 1.0, 1.0]
    chunked = client.forward_backward([datum(s, weights=weights) for s in sequences],
                                      "cross_entropy")
    client.optim_step(types.AdamParams(learning_rate=1e-2))
    out = chunked.result()
    assert len(out.loss_fn_outputs) == len(sequences)
    before = np.concatenate(logprobs_of(reference, sequences))
    got = np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])
    np.testing.assert_allclose(got, before, atol=1e-5)  # both chunks ran before the step
    assert out.metrics["loss:sum"] == pytest.approx(-before.sum(), rel=1e-5)
    # The same step in one request per half gives the same weights.
    for half in (sequences[:550], sequences[550:]):
        reference.forward_backward([datum(s, weights=weights) for s in half], "cross_entropy")
    reference.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    probe = sequences[:20]
    for a, b in zip(logprobs_of(client, probe), logprobs_of(reference, probe), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_custom_loss_runs_through_forward_and_real_valued_weights(service):
    """forward_backward_custom: the SDK runs forward, differentiates the loss itself and sends
    weights = -dC/dlogp with cross_entropy, so real-valued weights must scale each token's
    loss (Tinker's -logp * weights), not act as a 0/1 mask."""
    import torch

    seq = list(range(10, 30))
    weights = np.linspace(0.1, 2.0, len(seq) - 1)
    custom = service.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
    plain = service.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
    start = logprobs_of(plain, [seq])[0]
    np.testing.assert_allclose(logprobs_of(custom, [seq])[0], start)

    def weighted_nll(data, logprobs):
        loss = -(torch.cat(logprobs) * torch.as_tensor(weights, dtype=torch.float32)).sum()
        return loss, {"weighted_nll": float(loss.detach())}

    result = custom.forward_backward_custom([datum(seq)], weighted_nll).result()
    assert result.metrics["weighted_nll"] == pytest.approx(-(start * weights).sum(), rel=1e-5)
    out = plain.forward_backward([datum(seq, weights=weights)], "cross_entropy").result()
    assert out.metrics["loss:sum"] == pytest.approx(-(start * weights).sum(), rel=1e-5)
    adam = types.AdamParams(learning_rate=1e-2)
    custom.optim_step(adam).result()
    plain.optim_step(adam).result()
    after = logprobs_of(custom, [seq])[0]
    np.testing.assert_allclose(after, logprobs_of(plain, [seq])[0], atol=1e-5)
    assert np.abs(after - start).max() > 1e-4  # the step moved the weights


def test_closing_a_service_client_releases_its_models(server):
    import json
    import urllib.error
    import urllib.request

    own = tinker.ServiceClient(base_url=server.url, api_key=server.api_key)
    client = own.create_lora_training_client(base_model="tiny", rank=4).result()
    logprobs_of(client, [[1, 2, 3]])
    own.close("success").result()  # POST /api/v1/sessions/ID/finish
    key = {"X-API-Key": server.api_key}
    capabilities = urllib.request.Request(f"{server.url}/api/v1/get_server_capabilities",
                                          headers=key)
    with urllib.request.urlopen(capabilities) as reply:
        assert json.loads(reply.read())["supported_models"][0]["model_name"] == "tiny"
    ask = urllib.request.Request(f"{server.url}/api/v1/get_info", method="POST",
                                 data=json.dumps({"model_id": client.model_id}).encode(),
                                 headers={"Content-Type": "application/json", **key})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(ask, timeout=30)
    assert caught.value.code == 404
    assert "unknown model" in json.loads(caught.value.read())["detail"]
    # Its heartbeats now answer 410, which ends them in any client still holding the session.
    session = client.model_id.split(":train:")[0]
    body = json.dumps({"session_id": session, "type": "session_heartbeat"}).encode()
    status, _ = _post(f"{server.url}/api/v1/session_heartbeat", body,
                      {"Content-Type": "application/json", **key})
    assert status == 410


def test_errors_reach_the_sdk_as_one_clear_message(service):
    with pytest.raises(tinker.RequestFailedError, match="unknown base model 'nope'"):
        service.create_lora_training_client(base_model="nope", rank=4).result()
    client = service.create_lora_training_client(base_model="tiny", rank=4).result()
    with pytest.raises(tinker.BadRequestError, match="unknown loss_fn 'bogus'"):
        client.forward_backward([datum([1, 2, 3])], "bogus").result()
    client = service.create_lora_training_client(base_model="tiny", rank=4).result()
    bad = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                      loss_fn_inputs={"target_tokens": np.array([2, 3], dtype=np.int64)})
    with pytest.raises(tinker.BadRequestError, match="target_tokens has 2 entries for 3"):
        client.forward_backward([bad], "cross_entropy").result()
    client = service.create_lora_training_client(base_model="tiny", rank=4).result()
    floats = types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                         loss_fn_inputs={"target_tokens": np.array([2, 3], dtype=np.float32)})
    with pytest.raises(tinker.BadRequestError, match="target_tokens: must be an integer tensor"):
        client.forward_backward([floats], "cross_entropy").result()
    client = service.create_lora_training_client(base_model="tiny", rank=4).result()
    with pytest.raises(tinker.BadRequestError, match="needs advantages"):
        client.forward_backward([datum([1, 2, 3])], "ppo").result()
    client = service.create_lora_training_client(base_model="tiny", rank=4).result()
    with pytest.raises(tinker.RequestFailedError, match="token id 1000000 is outside the voc"):
        client.forward_backward([datum([1, 2, 10**6])], "cross_entropy").result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint at"):
        service.create_sampling_client(model_path="tinker://x:train:0/sampler_weights/w").result()
    with pytest.raises(tinker.BadRequestError, match="invalid training run id"):
        service.create_sampling_client(model_path="tinker://../sampler_weights/w").result()


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def test_every_route_but_health_needs_the_servers_key(server):
    """Stops anyone who can reach the port (a sandboxed agent on a shared network) from
    training, sampling or loading checkpoints: without the key every route answers 401. The key
    the server made is in its data dir, mode 0600, and never in its log."""
    import json
    import urllib.request

    api = f"{server.url}/api/v1"
    plain = {"Content-Type": "application/json"}
    for route in ["client/config", "create_session", "create_model", "asample",
                  "forward_backward", "retrieve_future", "save_weights", "load_weights"]:
        for headers in [plain, {**plain, "X-API-Key": "tml-guess"},
                        {**plain, "Authorization": "Bearer tml-guess"}]:
            assert _post(f"{api}/{route}", b"{}", headers)[0] == 401, (route, headers)
    assert urllib.request.urlopen(f"{api}/healthz").status == 200
    body = json.dumps({"tags": [], "user_metadata": None, "sdk_version": "0"}).encode()
    assert _post(f"{api}/create_session", body,
                 {**plain, "Authorization": f"Bearer {server.api_key}"})[0] == 200
    key_file = server.log_path.parent / "data" / "api-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert server.api_key not in server.log_path.read_text()
    # The SDK sends telemetry by default and logs a traceback for any answer but its own type.
    status, answer = _post(f"{api}/telemetry", b"{}", {**plain, "X-API-Key": server.api_key})
    assert status == 200 and types.TelemetryResponse.model_validate_json(answer)


def test_bodies_are_bounded_by_the_largest_request_the_sdk_sends(server):
    """Stops one request from taking the server's memory: the body limit was 1 GiB, plain or
    inflated from a small gzip body. The limit is one forward_backward chunk (the size the
    server asks the SDK for) or one datum of the longest context, doubled for protobuf."""
    import gzip

    from skyrl_agent.tinker.config import max_body_bytes

    limit = max_body_bytes(1024)  # the char model's context
    assert limit < 16 << 20
    keyed = {"X-API-Key": server.api_key, "Content-Type": "application/x-protobuf"}
    url = f"{server.url}/api/v1/forward_backward"
    assert _post(url, b"\0" * (limit + 1), keyed)[0] == 413
    bomb = gzip.compress(b"\0" * (limit + 1))
    assert len(bomb) < 1 << 20
    assert _post(url, bomb, {**keyed, "Content-Encoding": "gzip"})[0] == 413


@pytest.mark.parametrize("argv, message", [
    (["--model", "/no/such/folder"], "unknown model '/no/such/folder'"),
    (["--api-key", "not-a-tinker-key"], "--api-key must start with tml-"),
    (["--model", "a=smollm2-135m", "--model", "a=smollm2-135m"], "--model 'a' given twice"),
    (["--model", "=x"], "give NAME=FOLDER"),
    (["--tensor-parallel", "2"], "tensor_parallel=2 needs backend=megatron"),
    (["--tenant", "../x"], "--tenant '../x': a new name"),
    (["--tenant", "default"], "--tenant 'default': a new name"),
    (["--engine", "sglang"], "--engine 'sglang': embedded or vllm"),
])
def test_tinker_serve_bad_input_is_one_error_line(argv, message, tmp_path):
    import subprocess

    from tests.tinker_server import CLI

    done = subprocess.run([CLI, "tinker-serve", "--port", "0", "--data-dir", str(tmp_path),
                           *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines

