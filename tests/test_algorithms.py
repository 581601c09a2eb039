"""The RL algorithms against numbers worked out by hand (each derivation sits next to it)."""

from __future__ import annotations

import math

import pytest
import torch

from skyrl_agent.backends.algorithms import (
    CORRECTIONS,
    POLICY_LOSSES,
    REDUCTIONS,
    cispo_loss,
    cross_entropy_loss,
    dro_loss,
    entropy_BT,
    gspo_loss,
    icepop_mask,
    importance_sampling_loss,
    kl_penalty,
    policy_loss,
    ppo_clip_loss,
    reduce,
    sequence_mask_geometric,
    token_weights,
    truncated_is_weights,
)
from skyrl_agent.rl.advantages import (
    ADVANTAGES,
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)

F64 = torch.float64
NAN = float("nan")


def t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def close(actual: torch.Tensor, expected: list, atol: float = 1e-6) -> None:
    """Same shape, and every entry within atol (torch.testing imports slowly, so not used)."""
    want = t(expected)
    got = actual.detach().to(F64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert bool(((got - want).abs() <= atol).all()), f"\n{got.tolist()}\n!=\n{want.tolist()}"


def leaf(values: list) -> torch.Tensor:
    return t(values).requires_grad_(True)


def grad_of(loss_BT: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss_BT.sum(), x)
    return grad


# Two groups: [1, 0, 0, 1] and [1, 1, 0, pad]; the pad's reward (100) must be ignored.
REWARDS = t([[1, 0, 0, 1], [1, 1, 0, 100]])
VALID = torch.tensor([[True, True, True, True], [True, True, True, False]])


# ---------------------------------------------------------------- advantages


def test_grpo_by_hand() -> None:
    # group 0: mean 1/2, deviations +-1/2, Bessel var = 4 * 1/4 / 3 = 1/3, std = 0.57735
    #   -> +-0.5 / 0.57735 = +-0.866025
    # group 1: mean 2/3, deviations 1/3, 1/3, -2/3, var = (1/9 + 1/9 + 4/9) / 2 = 1/3
    #   -> 0.577350, 0.577350, -1.154701; pad -> 0
    close(grpo_advantages(REWARDS, VALID),
          [[0.866025, -0.866025, -0.866025, 0.866025], [0.577350, 0.577350, -1.154701, 0.0]],
          atol=1e-5)


def test_grpo_degenerate_groups_give_zero() -> None:
    # one valid sample (NaN pads never read), no valid sample, all rewards equal (0 / eps)
    rewards = t([[5, NAN, NAN], [NAN, NAN, NAN], [1, 1, 1]])
    valid = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    close(grpo_advantages(rewards, valid), [[0, 0, 0], [0, 0, 0], [0, 0, 0]])


def test_dr_grpo_by_hand() -> None:
    # r - group mean, no std: group 0 mean 1/2, group 1 mean 2/3; a lone sample gives 0
    close(dr_grpo_advantages(REWARDS, VALID),
          [[0.5, -0.5, -0.5, 0.5], [1 / 3, 1 / 3, -2 / 3, 0.0]])
    close(dr_grpo_advantages(t([[4, NAN]]), torch.tensor([[True, False]])), [[0, 0]])


def test_rloo_by_hand() -> None:
    # group 0: 1 - (0+0+1)/3 = 2/3, 0 - (1+0+1)/3 = -2/3
    # group 1: 1 - (1+0)/2 = 1/2 (twice), 0 - (1+1)/2 = -1; pad 0
    close(rloo_advantages(REWARDS, VALID),
          [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.5, 0.5, -1.0, 0.0]])
    close(rloo_advantages(t([[4, 9]]), torch.tensor([[True, False]])), [[0, 0]])


def test_reinforce_pp_baseline_by_hand() -> None:
    # a = r - group mean over the 7 valid entries: +-1/2 (x4), 1/3, 1/3, -2/3; mean(a) = 0,
    # Bessel var = (4 * 1/4 + 1/9 + 1/9 + 4/9) / 6 = 5/18, std = 0.527046
    #   -> 0.5 / 0.527046 = 0.948683, (1/3) / ... = 0.632456, (2/3) / ... = 1.264911
    out = reinforce_pp_baseline_advantages(REWARDS, VALID)
    close(out, [[0.948683, -0.948683, -0.948683, 0.948683], [0.632456, 0.632456, -1.264911, 0]],
          atol=1e-5)
    assert out[1, 3].item() == 0.0  # exactly, not -mean(a)/std(a) up to rounding


def test_reinforce_pp_counts_lone_valid_samples_and_small_batches() -> None:
    # [[1, 0], [7, pad]]: a = [1/2, -1/2, 0] over 3 valid entries, var = (1/4 + 1/4 + 0) / 2
    # = 1/4, std 1/2 -> [1, -1], [0, 0]. (Leaving the lone sample out would give std 0.7071.)
    rewards, valid = t([[1, 0], [7, NAN]]), torch.tensor([[True, True], [True, False]])
    close(reinforce_pp_baseline_advantages(rewards, valid), [[1, -1], [0, 0]], atol=1e-5)
    # fewer than two valid entries in the batch: the un-normalized a (0 for the lone sample)
    close(reinforce_pp_baseline_advantages(t([[3, NAN]]), torch.tensor([[True, False]])),
          [[0, 0]])


def test_compute_advantages_dispatches_and_rejects_unknown_names() -> None:
    assert set(ADVANTAGES) == {"grpo", "dr_grpo", "rloo", "reinforce_pp"}
    close(compute_advantages("rloo", REWARDS, VALID),
          [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.5, 0.5, -1.0, 0.0]])
    with pytest.raises(ValueError, match="dr_grpo"):
        compute_advantages("ppo", REWARDS, VALID)


def test_integer_rewards_give_float_advantages() -> None:
    out = dr_grpo_advantages(torch.tensor([[1, 0]]), torch.tensor([[True, True]]))
    assert out.dtype == torch.float32
    assert out.tolist() == [[0.5, -0.5]]


# ---------------------------------------------------------------- policy losses

# 2x3 PPO example; old logprob -1 everywhere, ratio r = exp(logp - old), clip [0.8, 1.28]:
#  (0,0) r=1.5, A=+1: -min(1.5, 1.28) = -1.28, clipped -> grad 0
#  (0,1) r=0.5, A=+1: -min(0.5, 0.8) = -0.5, unclipped -> grad -r*A = -0.5
#  (0,2) r=1.1, A=-1: -min(-1.1, -1.1) = 1.1 -> grad -r*A = 1.1
#  (1,0) r=0.5, A=-1: -min(-0.5, -0.8) = 0.8, clipped -> grad 0
#  (1,1) r=10, A=-1: -min(-10, -1.28) = 10 (grad 10); dual clip c=3 bounds it at -c*A = 3 (grad 0)
#  (1,2) r=2, A=+1: -1.28, clipped, but masked out (not in the metrics)
PPO_RATIOS = [[1.5, 0.5, 1.1], [0.5, 10.0, 2.0]]
PPO_ADV = t([[1, 1, -1], [-1, -1, 1]])
PPO_MASK = t([[1, 1, 1], [1, 1, 0]])
PPO_OLD = torch.full((2, 3), -1.0, dtype=F64)


def ppo_logprobs() -> torch.Tensor:
    return (PPO_OLD + t(PPO_RATIOS).log()).requires_grad_(True)


def test_ppo_clip_asymmetric_by_hand() -> None:
    logp = ppo_logprobs()
    loss, metrics = ppo_clip_loss(logp, PPO_OLD, PPO_ADV, PPO_MASK, clip_low=0.2, clip_high=0.28)
    close(loss, [[-1.28, -0.5, 1.1], [0.8, 10.0, -1.28]])
    close(grad_of(loss, logp), [[0, -0.5, 1.1], [0, 10.0, 0]])
    # clipped and masked in: (0,0) and (1,0) of 5 tokens
    assert metrics == pytest.approx({"clip_fraction": 0.4, "dual_clip_fraction": 0.0})


def test_ppo_dual_clip_bounds_negative_advantages() -> None:
    logp = ppo_logprobs()
    loss, metrics = ppo_clip_loss(logp, PPO_OLD, PPO_ADV, PPO_MASK, clip_low=0.2, clip_high=0.28,
                                  dual_clip=3.0)
    close(loss, [[-1.28, -0.5, 1.1], [0.8, 3.0, -1.28]])
    close(grad_of(loss, logp), [[0, -0.5, 1.1], [0, 0, 0]])
    assert metrics == pytest.approx({"clip_fraction": 0.4, "dual_clip_fraction": 0.2})
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(logp, PPO_OLD, PPO_ADV, PPO_MASK, dual_clip=1.0)


def test_ppo_treats_old_logprobs_and_advantages_as_constants() -> None:
    logp, old, adv = leaf([[-0.5]]), leaf([[-1.0]]), leaf([[2.0]])
    loss, _ = ppo_clip_loss(logp, old, adv, t([[1]]), clip_high=1.0)
    loss.sum().backward()
    assert old.grad is None and adv.grad is None
    close(logp.grad, [[-2 * math.exp(0.5)]])  # r = e^0.5 < 2 unclipped: -r*A


# GSPO: sequence 0 has log-ratios [0.2, 0.4, (masked -0.6)], A = +1: s = exp(0.3) = 1.349859,
# above 1 + 4e-4, so every token's loss is -1.0004 and no gradient flows (counting the masked
# token would give s = exp(0 / 2) = 1, unclipped).
# Sequence 1 has log-ratios [1e-4, -1e-4, 3e-4], A = -2: s = exp(1e-4) = 1.000100005, inside
# [1 - 3e-4, 1 + 4e-4]: loss = -s*A = 2.00020001 per token, d loss / d logp_t = -A*s = 2.0002.
GSPO_LOGP = [[0.2, 0.4, -0.6], [1e-4, -1e-4, 3e-4]]
GSPO_ADV = t([[1, 1, 1], [-2, -2, -2]])
GSPO_MASK = t([[1, 1, 0], [1, 1, 1]])
GSPO_OLD = torch.zeros(2, 3, dtype=F64)


def test_gspo_token_form_by_hand() -> None:
    logp = leaf(GSPO_LOGP)
    loss, metrics = gspo_loss(logp, GSPO_OLD, GSPO_ADV, GSPO_MASK)
    close(loss, [[-1.0004] * 3, [2.00020001] * 3], atol=1e-8)
    close(grad_of(loss, logp), [[0, 0, 0], [2.00020001] * 3], atol=1e-8)
    assert metrics == pytest.approx({"clip_fraction": 0.5})


def test_gspo_equals_the_sequence_level_objective() -> None:
    # -(1/G) sum_i min(s_i A_i, clip(s_i) A_i) = -(1.0004 * 1 + 1.000100005 * -2) / 2
    # = 0.4999000050; its gradient on sequence 1 is -A*s / (G * |y|) = 2.0002 / 6 = 0.33336667
    logp = leaf(GSPO_LOGP)
    loss, _ = gspo_loss(logp, GSPO_OLD, GSPO_ADV, GSPO_MASK)
    total = reduce(loss, GSPO_MASK, "seq-mean-token-mean")
    assert total.item() == pytest.approx(0.4999000050, abs=1e-9)
    (grad,) = torch.autograd.grad(total, logp)
    close(grad, [[0, 0, 0], [0.33336667] * 3], atol=1e-8)


def test_cispo_keeps_gradient_on_clipped_tokens() -> None:
    # old = log 0.5; token 0: logp = log 0.75, r = 1.5 > 1.28 -> w = 1.28, A = +1:
    #   loss = -1.28 * log 0.75 = 0.368233, grad = -w*A = -1.28 (clipped yet not zero)
    # token 1: logp = log 0.25, r = 0.5; default clip_low = 1 puts no floor -> w = 0.5, A = -1:
    #   loss = 0.5 * log 0.25 = -0.693147, grad = -w*A = 0.5
    old, adv, mask = t([[0.5, 0.5]]).log(), t([[1, -1]]), t([[1, 1]])
    logp = t([[0.75, 0.25]]).log().requires_grad_(True)
    loss, metrics = cispo_loss(logp, old, adv, mask)
    close(loss, [[0.368233, -0.693147]])
    close(grad_of(loss, logp), [[-1.28, 0.5]])
    assert metrics == pytest.approx({"clip_fraction": 0.5})
    # with clip_low = 0.2 the floor 0.8 lifts token 1's weight: grad 0.8; both tokens clipped
    loss, metrics = cispo_loss(logp, old, adv, mask, clip_low=0.2)
    close(grad_of(loss, logp), [[-1.28, 0.8]])
    assert metrics == pytest.approx({"clip_fraction": 1.0})


def test_importance_sampling_by_hand() -> None:
    # r = [1.5, 0.5], A = [1, -2]: loss = -r*A = [-1.5, 1.0]; d/dlogp = -r*A as well
    logp = t([[1.5, 0.5]]).log().requires_grad_(True)
    loss, metrics = importance_sampling_loss(logp, torch.zeros(1, 2, dtype=F64), t([[1, -2]]),
                                             t([[1, 1]]))
    close(loss, [[-1.5, 1.0]])
    close(grad_of(loss, logp), [[-1.5, 1.0]])
    assert metrics == {}


def test_dro_by_hand() -> None:
    # old = [-1, -1]; logp = [-0.5, -2], A = [2, -1], beta = 0.5:
    #   token 0: d = 0.5, loss = -(-0.5*2 - 0.25*0.25) = 1.0625; grad = -A + beta*d = -1.75
    #   token 1: d = -1, loss = -(-2*-1 - 0.25*1) = -1.75;        grad = -A + beta*d = 0.5
    #   log_ratio_sq over the masked-in tokens: (0.25 + 1) / 2 = 0.625
    logp = leaf([[-0.5, -2.0]])
    loss, metrics = dro_loss(logp, t([[-1.0, -1.0]]), t([[2, -1]]), t([[1, 1]]), beta=0.5)
    close(loss, [[1.0625, -1.75]])
    close(grad_of(loss, logp), [[-1.75, 0.5]])
    assert metrics == pytest.approx({"log_ratio_sq": 0.625})
    # beta = 0 is REINFORCE on log p: loss = -logp * A, whatever the sampler said
    loss, _ = dro_loss(leaf([[-0.5, -2.0]]), t([[-9.0, 3.0]]), t([[2, -1]]), t([[1, 1]]), beta=0)
    close(loss, [[1.0, -2.0]])
    with pytest.raises(ValueError, match="beta"):
        dro_loss(leaf([[-0.5]]), t([[-1.0]]), t([[1]]), t([[1]]), beta=-1)


def test_cross_entropy_by_hand() -> None:
    logp = leaf([[-0.5, -2.0]])
    loss, metrics = cross_entropy_loss(logp, t([[1, 1]]))
    close(loss, [[0.5, 2.0]])
    close(grad_of(loss, logp), [[-1, -1]])
    assert metrics == {}


def test_policy_loss_registry() -> None:
    assert set(POLICY_LOSSES) == {"ppo", "gspo", "cispo", "importance_sampling", "dro"}
    loss, _ = policy_loss("ppo", ppo_logprobs(), PPO_OLD, PPO_ADV, PPO_MASK, clip_high=0.28)
    close(loss, [[-1.28, -0.5, 1.1], [0.8, 10.0, -1.28]])
    with pytest.raises(ValueError, match="cispo"):
        policy_loss("grpo", ppo_logprobs(), PPO_OLD, PPO_ADV, PPO_MASK)


# ---------------------------------------------------------------- off-policy corrections


def test_truncated_is_by_hand() -> None:
    # ratios trainer/sampler: row 0 [0.5, 1, 3] -> [0.5, 1, 2 (capped)];
    # row 1 [10 (masked), 1.5, NaN sampler (masked)] -> [0, 1.5, 0]
    # capped: 1 of 4 masked-in tokens; mean weight (0.5 + 1 + 2 + 1.5) / 4 = 1.25
    old = t([[0.5, 1, 3], [10, 1.5, 1]]).log().requires_grad_(True)
    sampler = t([[0, 0, 0], [0, 0, NAN]])
    mask = t([[1, 1, 1], [0, 1, 0]])
    weights, metrics = truncated_is_weights(old, sampler, mask)
    assert not weights.requires_grad
    close(weights, [[0.5, 1, 2], [0, 1.5, 0]])
    assert metrics == pytest.approx({"tis_capped_fraction": 0.25, "tis_mean_weight": 1.25})


def test_sequence_mask_geometric_by_hand() -> None:
    # geometric-mean ratio per sequence over its masked-in tokens, kept iff in [0.5, 2]:
    #  row 0 [3, 3 | 3]        rho = 3             -> rejected
    #  row 1 [4, 0.25 | 100]   rho = 1 (arithmetic mean 2.125 would reject) -> kept
    #  row 2 [0.25, 0.5 | 1]   rho = sqrt(1/8) = 0.354 -> rejected (below the floor)
    #  row 3 fully masked out  -> weight 0, not counted
    #  row 4 [1.9, 1.9, 1.9]   rho = 1.9           -> kept
    # rejected 2 of 4 sequences
    ratios = t([[3, 3, 3], [4, 0.25, 100], [0.25, 0.5, 1], [9, 9, 9], [1.9, 1.9, 1.9]])
    mask = t([[1, 1, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1]])
    weights, metrics = sequence_mask_geometric(ratios.log(), torch.zeros_like(ratios), mask)
    close(weights, [[0, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0], [1, 1, 1]])
    assert metrics == pytest.approx({"mis_masked_fraction": 0.5})


def test_icepop_by_hand() -> None:
    # token ratios [0.4, 0.6, 1.9, 2.1 (masked out), 2.5], kept iff in [0.5, 2]:
    # weights [0, 1, 1, 0, 0]; dropped 0.4 and 2.5 of 4 masked-in tokens
    ratios = t([[0.4, 0.6, 1.9, 2.1, 2.5]])
    weights, metrics = icepop_mask(ratios.log(), torch.zeros_like(ratios), t([[1, 1, 1, 0, 1]]))
    close(weights, [[0, 1, 1, 0, 0]])
    assert metrics == pytest.approx({"icepop_masked_fraction": 0.5})


def test_correction_registry_and_bounds() -> None:
    assert CORRECTIONS["tis"] is truncated_is_weights
    assert CORRECTIONS["mis"] is sequence_mask_geometric
    assert CORRECTIONS["icepop"] is icepop_mask
    assert len(CORRECTIONS) == 3
    zeros = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError):
        icepop_mask(zeros, zeros, zeros + 1, low=2.0, high=0.5)


# ---------------------------------------------------------------- KL and entropy


def test_kl_estimators_by_hand() -> None:
    # logp = log[0.5, 0.25], ref = log[0.25, 0.5]: d = logp - ref = [ln 2, -ln 2]
    # k1 = d; k2 = d^2 / 2 = 0.240227; k3 = exp(-d) + d - 1 = [0.5 + 0.693147 - 1, 2 - 0.693147
    # - 1] = [0.193147, 0.306853]; d k3 / d logp = 1 - exp(-d) = [0.5, -1]
    ref = t([[0.25, 0.5]]).log()
    logp = t([[0.5, 0.25]]).log().requires_grad_(True)
    close(kl_penalty(logp, ref, "k1"), [[0.693147, -0.693147]])
    close(kl_penalty(logp, ref, "k2"), [[0.240227, 0.240227]])
    k3 = kl_penalty(logp, ref, "k3")
    close(k3, [[0.193147, 0.306853]])
    close(grad_of(k3, logp), [[0.5, -1.0]])
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, "k4")


def test_entropy_by_hand() -> None:
    # uniform over 8 -> ln 8 = 2.079442; [100, 0, 0, 0] -> ~0;
    # p = [1/4, 3/4] from logits [0, ln 3]: -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335, unchanged
    # (and finite) when both logits are shifted by 1000
    close(entropy_BT(torch.zeros(1, 2, 8, dtype=F64)), [[2.079442, 2.079442]])
    logits = t([[[100, 0, 0, 0], [0, math.log(3), -1e9, -1e9], [1000, 1000 + math.log(3), 0, 0]]])
    close(entropy_BT(logits), [[0.0, 0.562335, 0.562335]])
    assert entropy_BT(logits.float()).dtype == torch.float32


# ---------------------------------------------------------------- reductions

# three sequences with 2, 1 and 0 masked-in tokens; 100 marks loss the mask leaves out
RED_LOSS = t([[1, 2, 100, 100], [4, 100, 100, 100], [100, 100, 100, 100]])
RED_MASK = t([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_token_weights_by_hand() -> None:
    # token-mean: 3 tokens -> 1/3 each
    close(token_weights(RED_MASK, "token-mean"),
          [[1 / 3, 1 / 3, 0, 0], [1 / 3, 0, 0, 0], [0, 0, 0, 0]])
    # seq-mean-token-mean: S = 2 sequences -> 1/(2*2) on sequence 0, 1/(2*1) on sequence 1
    close(token_weights(RED_MASK, "seq-mean-token-mean"),
          [[0.25, 0.25, 0, 0], [0.5, 0, 0, 0], [0, 0, 0, 0]])
    # seq-mean-token-sum-norm with norm_len 4: 1/(2*4) everywhere masked in
    close(token_weights(RED_MASK, "seq-mean-token-sum-norm", norm_len=4),
          [[0.125, 0.125, 0, 0], [0.125, 0, 0, 0], [0, 0, 0, 0]])
    close(token_weights(RED_MASK, "sum"), RED_MASK.tolist())


def test_reduce_by_hand() -> None:
    # token-mean (1+2+4)/3 = 2.333333; seq-mean-token-mean (1+2)/4 + 4/2 = 2.75;
    # sum-norm (1+2+4)/8 = 0.875; sum 7
    assert reduce(RED_LOSS, RED_MASK, "token-mean").item() == pytest.approx(7 / 3)
    assert reduce(RED_LOSS, RED_MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)
    assert reduce(RED_LOSS, RED_MASK, "seq-mean-token-sum-norm", 4).item() == pytest.approx(0.875)
    assert reduce(RED_LOSS, RED_MASK, "sum").item() == pytest.approx(7.0)
    # inf / NaN where the mask is 0 does not leak into the loss
    poisoned = RED_LOSS.clone()
    poisoned[0, 3], poisoned[2, 0] = NAN, math.inf
    assert reduce(poisoned, RED_MASK, "token-mean").item() == pytest.approx(7 / 3)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_micro_batches_sum_to_the_full_batch(reduction: str) -> None:
    # weights computed once on the whole batch, sliced with the micro-batches
    weights = token_weights(RED_MASK, reduction, norm_len=4)
    full = (RED_LOSS * weights).sum()
    halves = (RED_LOSS[:1] * weights[:1]).sum() + (RED_LOSS[1:] * weights[1:]).sum()
    assert halves.item() == pytest.approx(full.item(), abs=1e-12)
    assert full.item() == pytest.approx({"token-mean": 7 / 3, "seq-mean-token-mean": 2.75,
                                         "seq-mean-token-sum-norm": 0.875, "sum": 7}[reduction])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_mask_gives_zero_weights(reduction: str) -> None:
    weights = token_weights(torch.zeros(2, 3), reduction, norm_len=4)
    assert weights.dtype == torch.float32
    assert weights.tolist() == [[0.0] * 3] * 2


def test_reduction_errors() -> None:
    with pytest.raises(ValueError, match="token-mean"):
        token_weights(RED_MASK, "mean")
    for norm_len in (None, 0, -1):
        with pytest.raises(ValueError, match="norm_len"):
            token_weights(RED_MASK, "seq-mean-token-sum-norm", norm_len=norm_len)


# ---------------------------------------------------------------- edges the cases above leave open


def test_two_valid_samples_are_enough_for_rloo_and_reinforce_pp() -> None:
    """Stops: a '>= 2 valid samples' rule read as '> 2', which silently zeroes the advantage of
    every group of two (the smallest group RLOO is defined for) and leaves a batch of two
    entries un-normalized."""
    # RLOO [3, 1, pad]: 3 - 1 = 2, 1 - 3 = -2 (each minus the other's reward)
    close(rloo_advantages(t([[3, 1, NAN]]), torch.tensor([[True, True, False]])),
          [[2, -2, 0]])
    # REINFORCE++ [[3, 1]]: a = [1, -1], mean 0, Bessel std sqrt((1 + 1) / 1) = sqrt 2
    #   -> +-1/sqrt 2 = +-0.707107 (the un-normalized a would be +-1)
    close(reinforce_pp_baseline_advantages(t([[3, 1]]), torch.tensor([[True, True]])),
          [[0.707107, -0.707107]])


def test_eps_bounds_the_advantages_of_a_nearly_uniform_group() -> None:
    """Stops: an eps subtracted (or dropped) from the std: rewards 1e-6 apart would get
    advantages of either sign or of any size, rather than damped ones."""
    # [1e-6, 0]: deviations +-5e-7, Bessel std = 5e-7 * sqrt 2; with eps = 1e-6,
    # A = 5e-7 / (5e-7 sqrt 2 + 1e-6) = 1 / (sqrt 2 + 2) = 0.292893 (without eps: 0.707107)
    rewards, valid = t([[1e-6, 0]]), torch.tensor([[True, True]])
    damped = 1 / (math.sqrt(2) + 2)
    close(grpo_advantages(rewards, valid), [[damped, -damped]])
    close(reinforce_pp_baseline_advantages(rewards, valid), [[damped, -damped]])


def test_gspo_default_range_old_logprobs_masks_and_advantage_scale() -> None:
    """GSPO with the paper's range (3e-4, 4e-4), old logprobs -1 (not 0) and advantages of
    magnitude other than 1. Stops: the lower clip lost or widened (a negative advantage would
    push an already-lowered sequence further down), masked tokens leaking into s_i, a
    one-token sequence averaged over more than one token, the clipped term divided by A, and
    a clipped sequence without masked tokens missing from clip_fraction."""
    # row 0: d = [-1e-3, -1e-3 | masked +5], A = -2: s = e^-1e-3 = 0.9990005 < 1 - 3e-4;
    #   -min(s * -2, 0.9997 * -2) = 1.9994 on the clipped branch -> no gradient
    # row 1: d = [1e-4 | masked, masked], A = 0.5: s = e^1e-4, inside; loss = -0.5 s
    #   = -0.50005000, gradient -A * s = -0.50005000 on its one token
    # row 2: d = [0.3, 0.3, 0.3], A = 1: s = e^0.3 > 1.0004 -> -1.0004, clipped, no gradient
    # row 3: all masked (d = 5): s = e^0 = 1, loss -A = -1; no sequence for the metric
    # clip_fraction: rows 0 and 2 of the 3 with a masked-in token
    old = torch.full((4, 3), -1.0, dtype=F64)
    d = t([[-1e-3, -1e-3, 5], [1e-4, 7, 7], [0.3, 0.3, 0.3], [5, 5, 5]])
    mask = t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    adv = t([[-2] * 3, [0.5] * 3, [1] * 3, [1] * 3])
    logp = (old + d).requires_grad_(True)
    loss, metrics = gspo_loss(logp, old, adv, mask)
    s1 = -0.5 * math.exp(1e-4)
    close(loss, [[1.9994] * 3, [s1] * 3, [-1.0004] * 3, [-1.0] * 3], atol=1e-9)
    grad = grad_of(loss * mask, logp)
    close(grad, [[0, 0, 0], [s1, 0, 0], [0, 0, 0], [0, 0, 0]], atol=1e-9)
    assert metrics == pytest.approx({"clip_fraction": 2 / 3})


def test_a_wild_sequence_ratio_is_clamped_to_e_to_the_20() -> None:
    """Stops: an unclamped sequence log-ratio, which overflows float32 to inf (NaN in the
    backward pass) for a sequence the sampler found far less likely than the trainer, and
    which the lower clamp bounds at e^-20 the other way."""
    # mean log-ratio +100 with A = -1: the unclipped branch -s * A = s, clamped to e^20
    # mean log-ratio -100 with A = +1 (float64 to see it): -min(s, clip(s)) = -s = -e^-20
    up, _ = gspo_loss(torch.full((1, 2), 100.0), torch.zeros(1, 2), -torch.ones(1, 2),
                      torch.ones(1, 2))
    assert up[0].tolist() == pytest.approx([math.exp(20)] * 2, rel=1e-5)
    down, _ = gspo_loss(torch.full((1, 2), -100.0, dtype=F64), torch.zeros(1, 2, dtype=F64),
                        torch.ones(1, 2, dtype=F64), torch.ones(1, 2, dtype=F64))
    assert down[0].tolist() == pytest.approx([-math.exp(-20)] * 2, rel=1e-9)


def test_cispo_scales_by_the_advantage_and_counts_a_ratio_on_the_bound_as_inside() -> None:
    """Stops: the advantage dividing the weight (invisible with A = +-1) and a ratio exactly
    on a bound counted as clipped (its weight is the ratio itself)."""
    # r = 1.5 clipped to 1.28, A = 2: loss = -1.28 * 2 * log 0.75 = 0.736466, grad -2.56;
    # r = 0.5, A = -0.5: loss = 0.5 * 0.5 * log 0.25 = -0.346574, grad 0.25
    old = t([[0.5, 0.5]]).log()
    logp = t([[0.75, 0.25]]).log().requires_grad_(True)
    loss, _ = cispo_loss(logp, old, t([[2, -0.5]]), t([[1, 1]]))
    close(loss, [[0.736466, -0.346574]])
    close(grad_of(loss, logp), [[-2.56, 0.25]])
    # on-policy tokens (r = 1 exactly) with a range of width 0 on either side: r is on the
    # bound, not outside it
    same = t([[-0.7, -1.2]])
    for low, high in ((0.0, 0.5), (0.5, 0.0)):
        _, metrics = cispo_loss(same, same, t([[1, -1]]), t([[1, 1]]), clip_low=low,
                                clip_high=high)
        assert metrics == {"clip_fraction": 0.0}


def test_dro_default_beta_and_log_ratio_sq_over_masked_in_tokens_only() -> None:
    """Stops: a default beta other than the documented 0.05 (Tinker's docs), and the metric
    divided by the mask (inf for a masked-out token) or averaged over more tokens than are
    masked in."""
    # d = logp - old = [0.5, -1]; default beta 0.05: loss_0 = -(-0.5 * 2 - 0.025 * 0.25)
    # = 1.00625, loss_1 = -(-2 * -1 - 0.025 * 1) = -1.975; with token 1 masked out,
    # log_ratio_sq is token 0's alone: 0.25
    loss, metrics = dro_loss(leaf([[-0.5, -2.0]]), t([[-1.0, -1.0]]), t([[2, -1]]),
                             t([[1, 0]]))
    close(loss, [[1.00625, -1.975]])
    assert metrics == pytest.approx({"log_ratio_sq": 0.25})
