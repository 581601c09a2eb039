"""Kill the Tinker server mid-run and start it again on the same data dir and port: saved
checkpoints load, sampling sessions continue, and the SDK's own retries carry a client through
the outage."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from skyrl_agent.model.weights.files import PREFIX, shared_memory_dir
from tests.test_tinker import datum, logprobs_of
from tests.tinker_server import (  # noqa: F401 - autouse fixture
    _sdk_env,
    free_port,
    server_key,
    spawn,
    wait_healthy,
)
from tests.tiny_models import char_model_dir

tinker = pytest.importorskip("tinker")
types = tinker.types


@pytest.mark.serial
@pytest.mark.slow
def test_checkpoints_and_sampling_sessions_survive_a_kill_and_the_sdk_rides_the_outage(
        tmp_path):
    model = f"tiny={char_model_dir(tmp_path / 'char', hidden=32, layers=1)}"
    port, data = free_port(), tmp_path / "data"
    first = spawn([model], data, port, tmp_path / "first.log")
    try:
        wait_healthy(port)
        # The restarted server keeps the key it made: the client outlives the restart.
        service = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}",
                                       api_key=server_key(data))
        client = service.create_lora_training_client(base_model="tiny", rank=4).result()
        seq = client.get_tokenizer().encode("survive a restart")
        for _ in range(2):
            client.forward_backward([datum(seq, weights=[1] * (len(seq) - 1))], "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=5e-2))
        state = client.save_state("before-kill").result().path
        sampler = client.save_weights_and_get_sampling_client().result()
        trained = logprobs_of(client, [seq])[0]
        params = types.SamplingParams(max_tokens=6, seed=3)
        prompt = types.ModelInput.from_ints(seq[:5])
        sampled = sampler.sample(prompt, 1, params).result().sequences[0]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert list(shared_memory_dir().glob(f"{PREFIX}{first.pid}-*"))  # what a kill leaves

    # Down for ~3 s while the client asks; the SDK retries connection errors with backoff.
    holder: dict[str, object] = {}

    def restart() -> None:
        time.sleep(3)
        holder["second"] = spawn([model], data, port, tmp_path / "second.log")

    restarter = threading.Thread(target=restart)
    restarter.start()
    try:
        started = time.monotonic()
        again = sampler.sample(prompt, 1, params).result().sequences[0]
        assert time.monotonic() - started > 2.5  # it really waited out the outage
        assert again.tokens == sampled.tokens  # the same ephemeral weights, the same seed
        np.testing.assert_allclose(again.logprobs, sampled.logprobs, atol=1e-5)

        restored = service.create_training_client_from_state_with_optimizer(state).result()
        np.testing.assert_allclose(logprobs_of(restored, [seq])[0], trained, atol=1e-6)
        # The killed server's trainer left its shared-memory weights; the new one removed them.
        assert not list(shared_memory_dir().glob(f"{PREFIX}{first.pid}-*"))
        with pytest.raises(tinker.RequestFailedError, match="restarted"):
            client.forward_backward([datum(seq, weights=[1] * (len(seq) - 1))],
                                    "cross_entropy").result()
        service.close("success").result()
    finally:
        restarter.join()
        second = holder.get("second")
        if second is not None:
            second.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
            second.wait(timeout=30)  # type: ignore[attr-defined]
