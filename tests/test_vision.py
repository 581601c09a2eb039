"""Vision-language models on the token-in/token-out path: a tiny LLaVA served with images
(Tinker-style prompt chunks, OpenAI image parts), the prefix cache keyed by the picture, and a
trainer that reads exactly what the sampler read (ids, image spans, pixels)."""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request

import pytest

from skyrl_agent.backends.backend import AdamParams, Datum
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.model.loading import LoraSettings
from skyrl_agent.model.vision import ImageError, ImageInputs, decode_image, image_bytes
from skyrl_agent.types import PlacedImage
from tests.tiny_models import char_tokenizer, char_vlm_dir, png

pytestmark = pytest.mark.slow
RED, BLUE = png((220, 20, 20)), png((20, 20, 220))


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return char_vlm_dir(tmp_path_factory.mktemp("vlm"))


@pytest.fixture(scope="module")
def vlm_server(vlm_dir):
    with embedded_server(str(vlm_dir)) as process:
        yield process


def _post(url: str, path: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + path, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _ids(text: str) -> list[int]:
    return char_tokenizer().encode(text, add_special_tokens=False)


def _chunks(image: bytes, before: str = "<|user|>What colour is this? ",
            after: str = "<|end|><|assistant|>") -> list[dict]:
    return [{"type": "encoded_text", "tokens": _ids(before)},
            {"type": "image", "data": base64.b64encode(image).decode()},
            {"type": "encoded_text", "tokens": _ids(after)}]


def _sample(url: str, chunks: list[dict], seed: int = 1) -> dict:
    status, body = _post(url, "/v1/completions", {
        "prompt_chunks": chunks, "max_tokens": 12, "seed": seed, "logprobs": 0,
        "return_token_ids": True, "ignore_eos": True})
    assert status == 200, body
    return body


def _datum(choice: dict, images: tuple[PlacedImage, ...]) -> tuple[Datum, list[float]]:
    sequence = choice["prompt_token_ids"] + choice["token_ids"]
    datum = Datum(tuple(sequence[:-1]), {
        "target_tokens": tuple(sequence[1:]),
        "weights": (0.0,) * (len(choice["prompt_token_ids"]) - 1)
        + (1.0,) * len(choice["token_ids"]),
        "advantages": (1.0,) * (len(sequence) - 1)}, images=images)
    return datum, choice["logprobs"]["token_logprobs"]


def _placed(vlm_dir, choice: dict, image: bytes) -> tuple[PlacedImage, ...]:
    inputs = ImageInputs.for_model(vlm_dir)
    assert inputs is not None
    offset = choice["prompt_token_ids"].index(inputs.token_id)
    return (PlacedImage(image, offset, inputs.token_count(image)),)


def _gap(trainer: tuple[float, ...], served: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(trainer[-len(served):], served, strict=True))


def test_an_image_chunk_is_served_and_the_trainer_reads_exactly_what_the_sampler_read(
        vlm_server, vlm_dir):
    """The sampler's ids hold each image's span of image tokens (16 for a 32-pixel tiny LLaVA
    with 8-pixel patches); the trainer, given those ids and the image bytes, computes the
    sampled tokens' logprobs within 1e-3; and the picture reaches the model: the same ids with
    another image give other logprobs, in the server and in the trainer."""
    red = _sample(vlm_server.url, _chunks(RED))["choices"][0]
    blue = _sample(vlm_server.url, _chunks(BLUE))["choices"][0]
    assert red["prompt_token_ids"] == blue["prompt_token_ids"]
    images = _placed(vlm_dir, red, RED)
    assert images[0].length == 16
    backend = TorchBackend(vlm_dir, dtype="float32")
    try:
        red_datum, red_served = _datum(red, images)
        [red_trained] = backend.forward([red_datum])
        assert _gap(red_trained, red_served) <= 1e-3
        # The same sampled ids scored with the blue picture instead: they move.
        [as_blue] = backend.forward([Datum(red_datum.model_input, red_datum.loss_fn_inputs,
                                           images=_placed(vlm_dir, red, BLUE))])
        assert _gap(as_blue, red_served) > 1e-3
        blue_datum, blue_served = _datum(blue, _placed(vlm_dir, blue, BLUE))
        [blue_trained] = backend.forward([blue_datum, red_datum])[:1]  # batched with red
        assert _gap(blue_trained, blue_served) <= 1e-3
    finally:
        backend.close()


def test_the_prefix_cache_never_reuses_one_picture_for_another(vlm_server):
    """Two prompts with the same ids but different images share their text before the image
    only; the same prompt again is served from the cache, with the same logprobs."""
    long_text = "<|system|>" + "You look at pictures and name their colours. " * 2 + "<|end|>"
    first = _sample(vlm_server.url, _chunks(RED, before=long_text + "<|user|>This: "), seed=4)
    offset = first["choices"][0]["prompt_token_ids"].index(103)
    other = _sample(vlm_server.url, _chunks(BLUE, before=long_text + "<|user|>This: "), seed=4)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] <= offset
    again = _sample(vlm_server.url, _chunks(RED, before=long_text + "<|user|>This: "), seed=4)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > offset + 16
    assert again["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    lp_first = first["choices"][0]["logprobs"]["token_logprobs"]
    lp_again = again["choices"][0]["logprobs"]["token_logprobs"]
    assert max(abs(a - b) for a, b in zip(lp_first, lp_again, strict=True)) <= 1e-4


def test_chat_completions_take_openai_image_parts(vlm_server):
    """An image_url part with a data URL renders through the processor's chat template: the
    prompt ids hold the image's span where the template put the image."""
    url = "data:image/png;base64," + base64.b64encode(RED).decode()
    status, body = _post(vlm_server.url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Colour? "},
            {"type": "image_url", "image_url": {"url": url}}]}],
        "max_tokens": 4, "return_token_ids": True})
    assert status == 200, body
    prompt = body["prompt_token_ids"]
    assert prompt.count(103) == 16
    assert prompt[: prompt.index(103)] == _ids("<|user|>Colour? ")


@pytest.mark.parametrize("attack, message", [
    ({"prompt": [5, 103, 103, 6]}, "belong to no image"),
    ({"prompt_chunks": [{"type": "encoded_text", "tokens": [5, 103, 6]}]}, "stands for an image"),
    ({"prompt_chunks": [{"type": "image", "data": "http://169.254.169.254/x.png"}]},
     "not fetched"),
    ({"prompt_chunks": [{"type": "image", "data": "bm90IGFuIGltYWdl"}]}, "not a readable image"),
    ({"prompt_chunks": [{"type": "image", "data": base64.b64encode(RED).decode(),
                         "expected_tokens": 9}]}, "not the expected 9"),
    ({"prompt_chunks": [{"type": "image", "data": base64.b64encode(RED).decode()}] * 33},
     "at most 32"),
])
def test_the_server_refuses_images_that_would_break_the_forward_or_reach_out(
        vlm_server, attack, message):
    """Image tokens with no image (the forward would fail for every row in the batch), an
    image fetched from a URL (the server would reach wherever it can), bytes that are no image,
    a token count other than the client expects, and more images than one forward should
    decode at once: each a 400 naming the problem."""
    status, body = _post(vlm_server.url, "/v1/completions", {**attack, "max_tokens": 2})
    assert status == 400 and message in body["error"]["message"]


def test_a_decompression_bomb_is_refused_before_it_is_decoded():
    """A PNG that declares 20000 x 20000 pixels in a few hundred bytes is refused from its
    header, before its pixels are inflated."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("1", (20000, 20000)).save(out, format="PNG")
    assert len(out.getvalue()) < 100_000
    with pytest.raises(ImageError, match="at most"):
        decode_image(out.getvalue())
    with pytest.raises(ImageError, match="not fetched"):
        image_bytes("file:///etc/passwd")


def test_lora_trains_the_language_model_and_the_server_follows(vlm_dir):
    """LoRA adapters go on the language model's layers only (none on the vision tower); after
    a step on an image datum and a weight push, the server's logprobs for that image match the
    trainer's again, and they moved."""
    backend = TorchBackend(vlm_dir, dtype="float32", lora=LoraSettings(rank=4))
    adapted = [name for name in backend.params if "lora_" in name]
    assert adapted and all("language_model" in name for name in adapted)
    try:
        with embedded_server(str(vlm_dir)) as server:  # its own: the weights change
            before = _sample(server.url, _chunks(RED), seed=2)["choices"][0]
            datum, _ = _datum(before, _placed(vlm_dir, before, RED))
            for _ in range(3):
                backend.forward_backward([datum], "importance_sampling")
                backend.optim_step(AdamParams(learning_rate=5e-2))
            update = backend.save_weights_for_sampler(1)
            status, body = _post(server.url, "/update_weights",
                                 {"path": str(update.path), "version": 1}, server.api_key)
            assert status == 200, body
            after = _sample(server.url, _chunks(RED), seed=2)["choices"][0]
        after_datum, after_served = _datum(after, _placed(vlm_dir, after, RED))
        [trained] = backend.forward([after_datum])
        assert _gap(trained, after_served) <= 1e-3
        [old] = backend.forward([datum])
        assert _gap(old, before["logprobs"]["token_logprobs"]) > 1e-2
    finally:
        backend.close()


async def _image_session(url: str, vlm_dir) -> tuple:
    """Two turns on the VLM: a task showing a red image, then an observation showing a blue
    one (as an agent's tool output would)."""
    from transformers import AutoTokenizer

    from skyrl_agent.inference.client import InferenceClient
    from skyrl_agent.llm.rendering import image_part
    from skyrl_agent.llm.session import LLMSession, SessionConfig

    tokenizer = AutoTokenizer.from_pretrained(vlm_dir)
    async with InferenceClient([url]) as client:
        session = LLMSession(client, tokenizer, SessionConfig(max_tokens=10), seed=7,
                             images=ImageInputs.for_model(vlm_dir))
        await session.chat([{"role": "system", "content": "You see."},
                            {"role": "user", "content": [
                                {"type": "text", "text": "Name this colour: "}, image_part(RED)]}])
        await session.chat([{"role": "user", "content": [
            {"type": "text", "text": "The screenshot: "}, image_part(BLUE),
            {"type": "text", "text": " and now?"}]}])
        return session.segments, session.drift_tokens()


def test_an_image_observation_is_recorded_stored_and_replayed_token_exactly(vlm_server, vlm_dir):
    """A session whose messages show images records each turn's images over their spans (the
    second turn keeps the first's and adds its own); a from-scratch render of the conversation
    gives the same ids (no drift); Parquet stores each image once and reads the turns back
    equal; and the packed datum scores the sampled tokens as the server did (<= 1e-3)."""
    import asyncio

    from skyrl_agent.data.schema import from_row, to_table
    from skyrl_agent.rl.batch import pack_turns
    from skyrl_agent.types import FinishReason, Reward, Trajectory

    segments, drift = asyncio.run(_image_session(vlm_server.url, vlm_dir))
    first, second = segments[0].turns
    assert [i.data for i in first.images] == [RED]
    assert [i.data for i in second.images] == [RED, BLUE]
    assert second.images[0] == first.images[0]
    for image in second.images:
        assert set(second.prompt_ids[image.offset : image.end]) == {103}
    assert second.prompt_ids.count(103) == 32
    assert drift == 0

    trajectory = Trajectory("vlm/t", 0, "test", segments, Reward(1.0), FinishReason.STOP)
    table = to_table([trajectory, trajectory])
    assert [len(row["images"]) for row in table.to_pylist()] == [2, 2]
    assert len(table.to_pylist()[0]["segments"][0]["turns"][1]["images"]) == 1  # only the new
    assert from_row(table.to_pylist()[0]) == trajectory

    datum = pack_turns(segments[0].turns, 1.0)
    assert datum is not None and datum.images == second.images
    backend = TorchBackend(vlm_dir, dtype="float32")
    try:
        [trained] = backend.forward([datum])
    finally:
        backend.close()
    for turn in (first, second):
        start = len(turn.prompt_ids) - 1  # position i predicts token i + 1
        recomputed = trained[start : start + len(turn.completion_ids)]
        assert max(abs(a - b) for a, b in zip(recomputed, turn.completion_logprobs,
                                               strict=True)) <= 1e-3


def test_megatron_refuses_a_vision_model_with_one_line(vlm_dir):
    """Megatron's GPT model has no vision tower: a clear configuration error, not a crash in a
    rank process."""
    from skyrl_agent.backends.build import build_backend
    from skyrl_agent.config import TrainerConfig
    from skyrl_agent.errors import ConfigError

    with pytest.raises(ConfigError, match="on the torch or fsdp backend"):
        build_backend(vlm_dir, TrainerConfig(backend="megatron"), None, seed=0)


def test_fsdp_ranks_train_a_vision_model_as_one_process_does(vlm_dir):
    """Two FSDP2 ranks (gloo) shard the LLaVA layer by layer, vision tower included: on image
    data their logprobs equal the one-process backend's, before and after the same step
    (1e-5), and each row's pixels go with it to its rank."""
    from skyrl_agent.backends.fsdp_backend import FsdpBackend

    inputs = ImageInputs.for_model(vlm_dir)
    assert inputs is not None
    data = []
    for colour in ((200, 0, 0), (0, 0, 200), (0, 200, 0)):
        placed = inputs.expand([_ids("<|user|>a "), png(colour), _ids("<|end|><|assistant|>red")])
        ids, n = placed.ids, len(placed.ids) - 1
        data.append(Datum(tuple(ids[:-1]), {
            "target_tokens": tuple(ids[1:]),
            "weights": (0.0,) * (n - 3) + (1.0,) * 3, "advantages": (1.0,) * n,
            "logprobs": (-4.0,) * n}, images=placed.images))
    one = TorchBackend(vlm_dir, dtype="float32", seed=0)
    ranks = FsdpBackend(vlm_dir, world_size=2, dtype="float32", seed=0)
    try:
        before = one.forward(data)
        for step in range(2):
            if step:
                for backend in (one, ranks):
                    backend.forward_backward(data, "importance_sampling")
                    backend.optim_step(AdamParams(learning_rate=1e-2))
            gaps = [abs(a - b) for x, y in zip(one.forward(data), ranks.forward(data),
                                               strict=True) for a, b in zip(x, y, strict=True)]
            assert max(gaps) <= 1e-5, (step, max(gaps))
        assert one.forward(data) != before  # the step moved them
    finally:
        one.close()
        ranks.close()


def test_rl_learns_to_read_the_picture_with_a_tiny_vlm(tmp_path, work_root):
    """toy-vision/red and toy-vision/blue have the same instruction text; only their pictures
    differ, and each rewards the share of its colour's letter among the first 8 characters. A
    model that does not see the pictures samples both from one distribution, where each
    character is r or b or neither, so its two rewards add up to at most 1: one of them stays
    at or below 0.5. The random tiny LLaVA starts near 0; with GRPO on the answer agent, both
    tasks pass 0.75 within 16 steps (seeded: 0.95 and 0.90 at the last step), and the trainer
    agrees with the sampler to 1e-3 every step."""
    import asyncio
    from collections import defaultdict

    from skyrl_agent.config import load_config
    from skyrl_agent.data.store import TrajectoryStore
    from skyrl_agent.jobs.train import reference_run

    model = char_vlm_dir(tmp_path / "model")
    config = load_config(None, [
        "agent.name=answer", "tasks.source=toy-vision", f"inference.model={model}",
        "inference.max_tokens=8", "collector.n_samples_per_task=16",
        "trainer.learning_rate=3e-2", "trainer.max_steps=16", f"sandbox.work_root={work_root}",
        # Not what this test is about: tests in the agent's sandbox halve each episode's cost.
        "verifier.default_mode=shared"])
    results = asyncio.run(reference_run(config, tmp_path / "run"))
    assert all(r.metrics["agreement/max_abs_diff"] < 1e-3 for r in results)
    rewards: dict[tuple[int, str], list[float]] = defaultdict(list)
    for t in TrajectoryStore(tmp_path / "run").load().trajectories:
        assert t.segments[0].turns[0].images  # every sample was shown its picture
        rewards[(t.segments[0].turns[0].policy_version, t.task_id)].append(t.reward.value)
    worse = [min(sum(v) / len(v) for (step, _), v in rewards.items() if step == s)
             for s in range(16)]
    assert worse[0] <= 0.1, worse
    assert max(worse[-3:]) >= 0.75, worse


async def test_codeact_looks_at_an_image_the_sandbox_holds(vlm_dir, tmp_path, work_root):
    """read-picture@3 leaves its chart in the sandbox only. CodeAct on a vision model gets the
    view_image tool: the turn after its call shows the chart's very bytes (read by the host
    from the sandbox, no link followed); pointed at a file that is no image (the answer it
    wrote) it gets an error line and no image; the answer scores 1.0."""
    from transformers import AutoTokenizer

    from skyrl_agent.agents.codeact import CodeActAgent
    from skyrl_agent.agents.teacher import Teacher
    from skyrl_agent.collector.one_sample import run_rollout
    from skyrl_agent.config import RunConfig, SandboxConfig
    from skyrl_agent.llm.session import LLMSession, SessionConfig
    from skyrl_agent.tasks.families import family
    from skyrl_agent.tasks.generated import write_task
    from skyrl_agent.tasks.spec import load_task

    generated = family("read-picture").generate(0, 3)
    write_task(generated, tmp_path / "task")
    chart = generated.blueprint.files["chart.png"]

    def call(tool: str, name: str, value: str) -> str:
        return (f"<function={tool}>\n<parameter={name}>\n{value}\n</parameter>\n</function>")

    tokenizer = AutoTokenizer.from_pretrained(vlm_dir)
    teacher = Teacher(tokenizer, [
        call("view_image", "path", "/app/chart.png"),
        call("execute_bash", "command", generated.blueprint.solution[0]),
        call("view_image", "path", "/app/answer.txt"), call("finish", "message", "done")])
    images = ImageInputs.for_model(vlm_dir)

    def sessions(agent, session_id):
        return LLMSession(teacher, tokenizer, SessionConfig(max_tokens=400),
                          tools=agent.tools_for(True), session_id=session_id, images=images)

    config = RunConfig(sandbox=SandboxConfig(backend="local", work_root=str(work_root)))
    trajectory = await run_rollout(load_task(tmp_path / "task"), 0, CodeActAgent(), config,
                                   sessions)
    turns = trajectory.segments[0].turns
    assert [len(turn.images) for turn in turns] == [0, 1, 1, 1]
    assert turns[1].images[0].data == chart
    assert "cannot be shown" in tokenizer.decode(list(turns[3].prompt_ids[-200:]))
    assert trajectory.reward.value == 1.0


@pytest.mark.parametrize("link, made", [
    ("../outside.png", "outside"), ("linked.png", "symlink"), ("notes.txt", "text")])
def test_an_instruction_image_must_be_a_picture_file_of_the_task(tmp_path, link, made):
    """A task's instruction may show only PNG/JPEG files inside its own directory: a path out
    of it, a symlink (which could point anywhere on the host), or another kind of file is a
    task error naming the link."""
    from skyrl_agent.errors import TaskError
    from skyrl_agent.tasks.spec import linked_images

    task = tmp_path / "task"
    task.mkdir()
    (tmp_path / "outside.png").write_bytes(RED)
    (task / "notes.txt").write_text("x")
    (task / "linked.png").symlink_to(tmp_path / "outside.png")
    (task / "good.png").write_bytes(BLUE)
    assert linked_images(task, "see ![x](good.png) and ![y](https://e.org/a.png)") == (
        ("good.png", BLUE),)
    with pytest.raises(TaskError, match=link.replace(".", r"\.")):
        linked_images(task, f"see ![{made}]({link})")


async def test_a_demonstration_on_a_vision_model_shows_the_pictures(vlm_dir, work_root):
    """Demonstrations (the teacher's episodes, SFT's data) of a vision model see the task's
    pictures as sampled episodes do: the session is built with the model's image inputs."""
    from transformers import AutoTokenizer

    from skyrl_agent.agents.answer import AnswerAgent
    from skyrl_agent.collector.demos import act_out
    from skyrl_agent.config import RunConfig, SandboxConfig
    from skyrl_agent.envs.episode import fresh_sandboxes
    from skyrl_agent.tasks import find_task

    task = find_task("toy-vision/red")
    config = RunConfig(sandbox=SandboxConfig(backend="local", work_root=str(work_root)))
    trajectory = await act_out(task, AnswerAgent, config, AutoTokenizer.from_pretrained(vlm_dir),
                               ["rrrrrrrr"], fresh_sandboxes(config.sandbox))
    [turn] = trajectory.segments[0].turns
    assert [image.data for image in turn.images] == [dict(task.instruction_images)["picture.png"]]
    assert trajectory.reward.value == 1.0
