"""Tinker's five named losses through the real SDK, with Tinker's own defaults and key names,
against the formulas of Tinker's loss docs computed here by hand (numpy, float64).

lp: the trained model's logprob of each target (the `logprobs` a forward returns), lq: the
sampler's (`loss_fn_inputs["logprobs"]`), r = exp(lp - lq), A: advantages, w: weights; every
loss sums over the datum's positions:
    cross_entropy        -sum w * lp
    importance_sampling  -sum r * A
    ppo                  -sum min(r * A, clip(r, low, high) * A)      low, high = 0.8, 1.2
    cispo                -sum sg(clip(r, low, high)) * A * lp         low, high = 0.0, 4.0
    dro                  -sum (lp * A - beta / 2 * (lp - lq)^2)       beta = 0.05 (ours: Tinker
                                                                      documents none)
The server computes in float32, so values agree to a relative 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_tinker import char_dir, datum, logprobs_of, server, service  # noqa: F401

tinker = pytest.importorskip("tinker")
types = tinker.types

RATIOS = np.array([0.5, 0.9, 1.1, 1.5, 3.0, 5.0])
"""Importance ratios cycled over the positions: inside PPO's clip range, below it, above it,
and between CISPO's old (1.28) and Tinker's (4.0) upper bound, and past both."""
ADVANTAGES = np.array([1.0, -1.0, 2.0, -0.5, 1.5, -2.0, 0.0])


def expected_losses(lp: np.ndarray, lq: np.ndarray, advantages: np.ndarray,
                    weights: np.ndarray, thresholds: tuple[float, float] | None = None,
                    beta: float = 0.05) -> dict[str, float]:
    r = np.exp(lp - lq)
    ppo_low, ppo_high = thresholds or (0.8, 1.2)
    cispo_low, cispo_high = thresholds or (0.0, 4.0)
    ppo = np.minimum(r * advantages, np.clip(r, ppo_low, ppo_high) * advantages)
    return {"cross_entropy": -(weights * lp).sum(),
            "importance_sampling": -(r * advantages).sum(),
            "ppo": -ppo.sum(),
            "cispo": -(np.clip(r, cispo_low, cispo_high) * advantages * lp).sum(),
            "dro": -(lp * advantages - beta / 2 * (lp - lq) ** 2).sum()}


@pytest.fixture(scope="module")
def case(service):  # noqa: F811 - the fixture imported above
    client = service.create_lora_training_client(base_model="tiny", rank=4, seed=11).result()
    seq = client.get_tokenizer().encode("losses, as tinker defines them.")
    lp = logprobs_of(client, [seq])[0]
    positions = np.arange(len(lp))
    # What the SDK sends is float32: the hand computation starts from the same numbers.
    lq = (lp - np.log(RATIOS[positions % len(RATIOS)])).astype(np.float32).astype(np.float64)
    advantages = ADVANTAGES[positions % len(ADVANTAGES)]
    weights = np.linspace(0.2, 1.4, len(lp)).astype(np.float32).astype(np.float64)
    return client, seq, lp, lq, advantages, weights


def data_for(loss_fn: str, seq, lq, advantages, weights) -> list:
    if loss_fn == "cross_entropy":
        return [datum(seq, weights=weights)]
    return [datum(seq, logprobs=lq, advantages=advantages)]


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo",
                                     "dro"])
def test_each_loss_with_tinkers_defaults_is_its_formula(case, loss_fn):
    """Stops: a loss whose value departs from Tinker's definition, a default that is not
    Tinker's (CISPO's upper bound was 1.28 here; ratios 1.5 and 3.0 tell 4.0 from it), and a
    forward that reports no loss (Tinker's forward returns it without a gradient)."""
    client, seq, lp, lq, advantages, weights = case
    expected = expected_losses(lp, lq, advantages, weights)[loss_fn]
    data = data_for(loss_fn, seq, lq, advantages, weights)
    forward = client.forward(data, loss_fn).result()
    assert forward.metrics["loss:sum"] == pytest.approx(expected, rel=1e-6)
    out = client.forward_backward(data, loss_fn).result()
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-6)
    np.testing.assert_array_equal(out.loss_fn_outputs[0]["logprobs"].to_numpy(), lp)
    client.optim_step(types.AdamParams(learning_rate=0.0)).result()  # drop the gradients


@pytest.mark.parametrize("loss_fn, config", [
    ("ppo", {"clip_low_threshold": 0.95, "clip_high_threshold": 1.3}),
    ("cispo", {"clip_low_threshold": 0.95, "clip_high_threshold": 1.3}),
    ("dro", {"beta": 0.4}),
])
def test_loss_fn_config_keys_as_tinker_spells_them(case, loss_fn, config):
    """Stops: thresholds read as epsilons, or `beta` ignored."""
    client, seq, lp, lq, advantages, weights = case
    thresholds = (config["clip_low_threshold"], config["clip_high_threshold"]) \
        if "beta" not in config else None
    expected = expected_losses(lp, lq, advantages, weights, thresholds,
                               config.get("beta", 0.05))[loss_fn]
    out = client.forward(data_for(loss_fn, seq, lq, advantages, weights), loss_fn,
                         config).result()
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("loss_fn, config, message", [
    ("ppo", {"clip_low_threshold": 1.5}, "clip_low_threshold must be between 0 and 1"),
    ("cispo", {"clip_high_threshold": 0.5}, "clip_high_threshold must be at least 1"),
    ("importance_sampling", {"clip_high_threshold": 1.2}, "do not apply to importance_sampling"),
    ("ppo", {"beta": 0.1}, "beta applies to dro only"),
    ("ppo", {"clip_epsilon": 0.2}, "clip_epsilon"),
])
def test_a_config_tinker_would_not_mean_is_refused_in_one_message(case, loss_fn, config,
                                                                  message):
    client, seq, _, lq, advantages, weights = case
    with pytest.raises(tinker.RequestFailedError, match=message):
        client.forward(data_for(loss_fn, seq, lq, advantages, weights), loss_fn,
                       config).result()
