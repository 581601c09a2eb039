"""The SDK's RestClient and the rest of its public methods against `tinker-serve`, as tenants:
checkpoints listed, described, published, given a lifetime and deleted; training runs and
sessions looked up; weights info; what the server cannot honour refused with the SDK's own
error; and one tenant's things out of another's reach unless published."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.test_tinker import char_dir, datum, logprobs_of  # noqa: F401
from tests.tinker_server import start_server

tinker = pytest.importorskip("tinker")
types = tinker.types


@pytest.fixture(scope="module")
def server(char_dir, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("tinker-rest")
    process = start_server([f"tiny={char_dir}"], folder / "data", folder / "server.log",
                           extra=["--tenant", "alice", "--tenant", "bob"])
    process.keys = {name: (folder / "data" / "api-keys" / name).read_text().strip()
                    for name in ("alice", "bob")}
    yield process
    process.stop()


@pytest.fixture(scope="module")
def alice(server):
    client = tinker.ServiceClient(base_url=server.url, api_key=server.keys["alice"])
    yield client
    client.close("success").result()


@pytest.fixture(scope="module")
def bob(server):
    client = tinker.ServiceClient(base_url=server.url, api_key=server.keys["bob"])
    yield client
    client.close("success").result()


def sft_step(client, seq: list[int]):
    client.forward_backward([datum(seq, weights=[1.0] * (len(seq) - 1))], "cross_entropy")
    return client.optim_step(types.AdamParams(learning_rate=5e-2)).result()


def test_checkpoints_through_the_rest_client(alice):
    """Stops: a listing that misses or invents checkpoints, a publish or lifetime that does not
    stick, a delete that leaves the checkpoint loadable, an expired checkpoint still served."""
    client = alice.create_lora_training_client(base_model="tiny", rank=4, seed=2).result()
    run = client.model_id
    seq = client.get_tokenizer().encode("rest of the api")
    sft_step(client, seq)
    state = client.save_state("s1").result().path
    sampler = client.save_weights_for_sampler("w1").result().path
    brief = client.save_state("brief", ttl_seconds=600).result().path
    rest = alice.create_rest_client()

    listed = rest.list_checkpoints(run).result().checkpoints
    assert {(c.checkpoint_type, c.tinker_path) for c in listed} == {
        ("training", state), ("sampler", sampler), ("training", brief)}
    assert all(c.size_bytes and not c.public for c in listed)
    assert next(c for c in listed if c.tinker_path == brief).expires_at is not None
    mine = rest.list_user_checkpoints().result()
    assert {c.tinker_path for c in mine.checkpoints} == {state, sampler, brief}
    assert mine.cursor.total_count == 3

    info = rest.get_training_run_by_tinker_path(state).result()
    assert (info.training_run_id, info.base_model, info.is_lora, info.lora_rank) == (
        run, "tiny", True, 4)
    assert info.model_owner == "alice" and info.last_sampler_checkpoint.tinker_path == sampler
    assert run in [r.training_run_id for r in rest.list_training_runs().result().training_runs]
    weights = rest.get_weights_info_by_tinker_path(sampler).result()
    assert (weights.base_model, weights.is_lora, weights.lora_rank) == ("tiny", True, 4)

    rest.publish_checkpoint_from_tinker_path(state).result()
    assert _checkpoint(rest, run, state).public
    rest.unpublish_checkpoint_from_tinker_path(state).result()
    assert not _checkpoint(rest, run, state).public

    # A lifetime: past it, the checkpoint is gone from the listing and cannot be loaded.
    rest.set_checkpoint_ttl_from_tinker_path(brief, 1).result()
    time.sleep(1.2)
    assert brief not in {c.tinker_path for c in rest.list_checkpoints(run).result().checkpoints}
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint"):
        client.load_state(brief).result()

    rest.delete_checkpoint_from_tinker_path(sampler).result()
    gone = client.save_state("gone").result().path
    rest.delete_checkpoint(run, "weights/gone").result()  # by run and checkpoint id
    assert {c.tinker_path for c in rest.list_checkpoints(run).result().checkpoints} == {state}
    with pytest.raises(tinker.NotFoundError):
        rest.get_weights_info_by_tinker_path(gone).result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        alice.create_sampling_client(model_path=sampler).result()


def test_sessions_states_and_samplers_through_the_sdk(server, alice):
    """create_training_client_from_state without the optimizer, a training client's own
    sampling client, compute_logprobs, the session and capability lookups."""
    client = alice.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
    seq = client.get_tokenizer().encode("sampled again")
    sft_step(client, seq)
    state = client.save_state("s").result().path
    sampler_path = client.save_weights_for_sampler("w").result().path
    trained = logprobs_of(client, [seq])[0]

    again = alice.create_training_client_from_state(state).result()
    np.testing.assert_allclose(logprobs_of(again, [seq])[0], trained, atol=1e-6)
    sampler = client.create_sampling_client(sampler_path)
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(seq)).result()
    assert scored[0] is None
    np.testing.assert_allclose(np.asarray(scored[1:], dtype=np.float64), trained, atol=1e-3)
    assert sampler.get_base_model() == "tiny"

    # A sampler handle rebuilds the same sampler elsewhere (another process, say).
    handle = sampler.get_sampler_handle()
    rebuilt = tinker.SamplingClient.from_sampler_handle(handle, api_key=server.keys["alice"])
    again_scored = rebuilt.compute_logprobs(types.ModelInput.from_ints(seq)).result()
    np.testing.assert_allclose(np.asarray(again_scored[1:], dtype=np.float64),
                               np.asarray(scored[1:], dtype=np.float64), atol=1e-6)
    rebuilt.holder.close()  # its own heartbeats, which would outlive the server

    rest = alice.create_rest_client()
    session = client.model_id.split(":train:")[0]
    assert session in rest.list_sessions().result().sessions
    found = rest.get_session(session).result()
    assert {client.model_id, again.model_id} <= set(found.training_run_ids)
    described = rest.get_sampler(found.sampler_ids[0]).result()
    assert described.base_model == "tiny"
    capabilities = alice.get_server_capabilities()
    assert [m.model_name for m in capabilities.supported_models] == ["tiny"]
    assert rest.get_server_capabilities().result() == capabilities


def test_a_custom_loss_handle_runs_client_side(alice):
    """create_custom_loss: the SDK traces the loss and, as this server offers no server-side
    custom losses, runs it in the client through forward_backward_custom."""
    import torch

    seq = list(range(10, 24))
    weights = np.linspace(0.5, 1.5, len(seq) - 1)
    custom = alice.create_lora_training_client(base_model="tiny", rank=4, seed=5).result()
    plain = alice.create_lora_training_client(base_model="tiny", rank=4, seed=5).result()

    def weighted_nll(logprobs: torch.Tensor, weights: torch.Tensor):
        return -(logprobs * weights).sum(), {}

    handle = alice.create_custom_loss(weighted_nll, {"logprobs": 1, "weights": 1}).result()
    result = custom.forward_backward_custom([datum(seq, weights=weights)], handle).result()
    expected = plain.forward_backward([datum(seq, weights=weights)], "cross_entropy").result()
    assert result.metrics["loss:sum"] == pytest.approx(expected.metrics["loss:sum"], rel=1e-5)


@pytest.mark.parametrize("call, name", [
    (lambda rest, path: rest.export_session_trace("x").result(), "export_session_trace"),
    (lambda rest, path: rest.search_sessions(types.SessionSearchRequest()).result(),
     "search_sessions"),
    (lambda rest, path: rest.get_billing_usage("2026-01-01", "2026-02-01").result(),
     "get_billing_usage"),
    (lambda rest, path: rest.get_external_weights_urls(
        path.replace("/weights/", "/external_weights/")).result(), "get_external_weights_urls"),
    (lambda rest, path: rest.copy_weights(path, "elsewhere").result(), "copy_weights"),
    (lambda rest, path: rest.assign_session_project("s", "p").result(),
     "assign_session_project"),
    (lambda rest, path: rest.get_audit_log().result(), "get_audit_log"),
    (lambda rest, path: rest.get_current_checkpoint_storage_usage().result(),
     "get_current_checkpoint_storage_usage"),
])
def test_what_a_self_hosted_server_cannot_honour_is_refused_by_name(alice, call, name):
    with pytest.raises(tinker.BadRequestError, match=f"{name} is not supported"):
        call(alice.create_rest_client(), "tinker://r/weights/x")


def test_an_external_weights_export_is_refused_by_name(alice):
    client = alice.create_lora_training_client(base_model="tiny", rank=4).result()
    with pytest.raises(tinker.BadRequestError, match="save_weights_external is not supported"):
        client.save_weights_external("out").result()


def test_two_tenants_train_side_by_side_and_stay_apart(alice, bob):
    """Stops: one tenant reaching another's model, sampling session, checkpoint or listing;
    and two tenants' interleaved requests disturbing each other's training."""
    clients = {name: service.create_lora_training_client(base_model="tiny", rank=rank,
                                                         seed=7).result()
               for name, service, rank in (("alice", alice, 4), ("bob", bob, 8))}
    texts = {"alice": "alice likes tea.", "bob": "bob rides a bike."}
    seqs = {name: clients[name].get_tokenizer().encode(text) for name, text in texts.items()}
    losses: dict[str, list[float]] = {"alice": [], "bob": []}
    for _ in range(6):  # both submit before either waits: the server interleaves them
        steps = {name: client.forward_backward(
            [datum(seqs[name], weights=[1.0] * (len(seqs[name]) - 1))], "cross_entropy")
            for name, client in clients.items()}
        for client in clients.values():
            client.optim_step(types.AdamParams(learning_rate=5e-2))
        for name, step in steps.items():
            losses[name].append(step.result().metrics["loss:sum"])
    for name, values in losses.items():
        assert values[-1] < values[0] - 1.0, (name, values)
    # Exactly what each would have reached alone: no request of one touched the other's model.
    for name, service, rank in (("alice", alice, 4), ("bob", bob, 8)):
        alone = service.create_lora_training_client(base_model="tiny", rank=rank, seed=7).result()
        for _ in range(6):
            sft_step(alone, seqs[name])
        np.testing.assert_allclose(logprobs_of(alone, [seqs[name]])[0],
                                   logprobs_of(clients[name], [seqs[name]])[0], atol=1e-5)

    # Each tenant's sampler serves its own weights.
    paths = {name: client.save_weights_for_sampler("mine").result().path
             for name, client in clients.items()}
    for name, service in (("alice", alice), ("bob", bob)):
        sampler = service.create_sampling_client(model_path=paths[name]).result()
        scored = sampler.compute_logprobs(types.ModelInput.from_ints(seqs[name])).result()
        np.testing.assert_allclose(np.asarray(scored[1:], dtype=np.float64),
                                   logprobs_of(clients[name], [seqs[name]])[0], atol=1e-3)

    # Bob cannot name Alice's checkpoint, model, run or sampling session...
    state = clients["alice"].save_state("private").result().path
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        bob.create_sampling_client(model_path=paths["alice"]).result()
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint"):
        bob.create_training_client_from_state(state).result()
    bob_rest = bob.create_rest_client()
    with pytest.raises(tinker.NotFoundError):
        bob_rest.get_training_run(clients["alice"].model_id).result()
    with pytest.raises(tinker.NotFoundError):
        bob_rest.list_checkpoints(clients["alice"].model_id).result()
    assert clients["alice"].model_id not in [
        r.training_run_id for r in bob_rest.list_training_runs(
            access_scope="accessible").result().training_runs]
    _refuses_another_tenants_model(bob, clients["alice"], seqs["bob"])

    # ...until Alice publishes it: then Bob reads it, but cannot change it.
    alice.create_rest_client().publish_checkpoint_from_tinker_path(paths["alice"]).result()
    shared = bob.create_sampling_client(model_path=paths["alice"]).result()
    scored = shared.compute_logprobs(types.ModelInput.from_ints(seqs["alice"])).result()
    np.testing.assert_allclose(np.asarray(scored[1:], dtype=np.float64),
                               logprobs_of(clients["alice"], [seqs["alice"]])[0], atol=1e-3)
    assert [c.tinker_path for c in bob_rest.list_checkpoints(
        clients["alice"].model_id).result().checkpoints] == [paths["alice"]]
    with pytest.raises(tinker.BadRequestError, match="another tenant"):
        bob_rest.delete_checkpoint_from_tinker_path(paths["alice"]).result()


def _refuses_another_tenants_model(service, victim, seq: list[int]) -> None:
    """A forward on another tenant's model id fails as if the model did not exist."""
    from tinker.lib.public_interfaces.training_client import TrainingClient

    intruder = TrainingClient(service.holder, model_seq_id=99, model_id=victim.model_id,
                              info=victim.get_info())
    with pytest.raises(tinker.RequestFailedError, match="unknown model"):
        intruder.forward([datum(seq)], "cross_entropy").result()


def _checkpoint(rest, run: str, path: str):
    return next(c for c in rest.list_checkpoints(run).result().checkpoints
                if c.tinker_path == path)
