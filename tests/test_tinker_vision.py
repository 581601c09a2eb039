"""Tinker's image chunks through the real SDK and `tinker-serve`: a tiny LLaVA sampled and
trained with ModelInputs that hold images, the trainer agreeing with the sampler."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types

from tests.tinker_server import _sdk_env, start_server  # noqa: F401 - the SDK's environment
from tests.tiny_models import char_model_dir, char_tokenizer, char_vlm_dir, png

pytestmark = pytest.mark.slow
RED, BLUE = png((220, 20, 20)), png((20, 20, 220))
IMAGE_TOKENS = 16
BEFORE = char_tokenizer().encode("<|user|>Colour? ", add_special_tokens=False)
AFTER = char_tokenizer().encode("<|end|><|assistant|>", add_special_tokens=False)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tinker-vlm")
    vlm = char_vlm_dir(folder / "vlm")
    text = char_model_dir(folder / "text")
    process = start_server([f"vlm={vlm}", f"text={text}"], folder / "data", folder / "log")
    client = tinker.ServiceClient(base_url=process.url, api_key=process.api_key)
    yield client
    client.close("success").result()
    process.stop()


def _prompt(image: bytes, tail: list[int] = (), expected: int | None = IMAGE_TOKENS):
    return types.ModelInput(chunks=[
        types.EncodedTextChunk(tokens=BEFORE),
        types.ImageChunk(data=image, format="png", expected_tokens=expected),
        types.EncodedTextChunk(tokens=[*AFTER, *tail])])


def _datum(image: bytes, sampled: list[int], expected: int | None = IMAGE_TOKENS):
    """The prompt and the sampled tokens as one datum: targets are the next ids (0 where the
    next position is an image's), weight on the sampled tokens only."""
    ids = [*BEFORE, *[0] * (expected or IMAGE_TOKENS), *AFTER, *sampled]
    weights = [0.0] * (len(ids) - 1 - len(sampled)) + [1.0] * len(sampled)
    return types.Datum(model_input=_prompt(image, sampled[:-1], expected), loss_fn_inputs={
        "target_tokens": np.asarray(ids[1:], dtype=np.int64),
        "weights": np.asarray(weights, dtype=np.float32)})


def test_image_chunks_are_sampled_and_trained_and_the_trainer_agrees(service):
    """A sampler and a LoRA training client of the VLM take ModelInputs with image chunks: the
    training forward of the sampled tokens gives the sampler's logprobs (<= 1e-3), another
    picture gives others, and forward_backward + optim_step move them."""
    client = service.create_lora_training_client(base_model="vlm", rank=4, seed=1).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=8, seed=3, temperature=1.0)
    sequence = sampler.sample(_prompt(RED), 1, params).result().sequences[0]
    sampled = list(sequence.tokens)

    def logprobs(image: bytes) -> np.ndarray:
        out = client.forward([_datum(image, sampled)], "cross_entropy").result()
        return out.loss_fn_outputs[0]["logprobs"].to_numpy()[-len(sampled):]

    np.testing.assert_allclose(logprobs(RED), sequence.logprobs, atol=1e-3)
    assert np.abs(logprobs(BLUE) - np.asarray(sequence.logprobs)).max() > 1e-3
    before = logprobs(RED)
    for _ in range(2):
        client.forward_backward([_datum(RED, sampled)], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert logprobs(RED).sum() > before.sum() + 0.1


def test_image_chunks_the_server_cannot_place_are_refused(service):
    """A datum's image chunk must say how many positions it takes, and say it right; a text
    model takes no image chunks. Each is the SDK's error naming the problem (the count is
    checked with the model, in the request's future)."""
    client = service.create_lora_training_client(base_model="vlm", rank=4, seed=1).result()
    sampled = [50, 51, 52]
    with pytest.raises(tinker.BadRequestError, match="needs expected_tokens"):
        client.forward([_datum(RED, sampled, expected=None)], "cross_entropy").result()
    # A refused request never took its place in the client's order: the next waits for it.
    client = service.create_lora_training_client(base_model="vlm", rank=4, seed=1).result()
    with pytest.raises(tinker.RequestFailedError, match="not the expected 9"):
        client.forward([_datum(RED, sampled, expected=9)], "cross_entropy").result()
    text = service.create_sampling_client(base_model="text").result()
    with pytest.raises(tinker.BadRequestError, match="not a vision model"):
        text.sample(_prompt(RED), 1, types.SamplingParams(max_tokens=2)).result()
