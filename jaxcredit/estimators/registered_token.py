"""Registry adapters of token- and turn-level credit (`registered` holds the registry): token
baselines, implicit rewards, returns and critics, Monte-Carlo values, the oracles and turns."""

import jax.numpy as jnp

from jaxcredit._masking import as_bool, sanitise
from jaxcredit.estimators import group, returns, token_credit, turn_credit, value_credit
from jaxcredit.estimators.registered import _grpo, register, token_level_rewards
from jaxcredit.rollout import Estimate, Rollout


@register("otb", needs=("sum_pi_squared",))
def _otb(rollout: Rollout, *, gamma: float = 1.0, eps: float = 1e-8):
  """Optimal token baseline; needs rollout.behaviour_logprobs and
  rollout.extras["sum_pi_squared"] [B, T] (`logprobs.token_sum_probs_squared`)."""
  rollout.require("behaviour_logprobs", by="otb")
  ret = returns.discounted_returns(token_level_rewards(rollout), rollout.mask, gamma=gamma)
  advantages = token_credit.optimal_token_baseline_advantages(
      ret, rollout.behaviour_logprobs, rollout.extra("sum_pi_squared", by="otb"), rollout.mask,
      group_size=rollout.group_size, eps=eps,
  )
  return Estimate(advantages=advantages, returns=ret)


@register("prime", needs=("prm_logprobs",))
def _prime(rollout: Rollout, *, beta: float = 0.05, gamma: float = 1.0):
  """PRIME (Cui et al., 2025): RLOO on outcome rewards plus discounted returns
  of implicit process rewards beta (log pi_prm - log pi_ref), each centred by
  the leave-one-out mean of the other responses' per-token implicit reward.
  pi_prm is rollout.extras["prm_logprobs"] when present (the implicit PRM
  trained in the loop, `jaxcredit.credit.implicit_prm`), else rollout.behaviour_logprobs."""
  rollout.require("ref_logprobs", by="prime")
  if "prm_logprobs" in rollout.extras:
    prm_logp = rollout.extra("prm_logprobs", by="prime")
  else:
    rollout.require("behaviour_logprobs", by="prime (without extras['prm_logprobs'])")
    prm_logp = rollout.behaviour_logprobs
  valid = as_bool(rollout.mask)
  implicit = token_credit.implicit_process_rewards(prm_logp, rollout.ref_logprobs, valid, beta=beta)
  per_token = jnp.sum(implicit, 1) / jnp.maximum(jnp.sum(valid, 1), 1)
  others_mean = per_token - group.rloo_advantages(per_token, group_size=rollout.group_size)
  process = jnp.where(valid, implicit - others_mean[:, None], 0.0)
  outcome = group.broadcast_to_tokens(
      group.rloo_advantages(rollout.rewards, group_size=rollout.group_size), valid
  )
  return outcome + returns.discounted_returns(process, valid, gamma=gamma)


@register("grpo_high_entropy")
def _grpo_high_entropy(rollout: Rollout, *, rho: float = 0.2, eps: float = 1e-6):
  """GRPO advantages on the top-rho entropy tokens only (Wang et al., 2025);
  needs rollout.entropy."""
  rollout.require("entropy", by="grpo_high_entropy")
  keep = token_credit.high_entropy_mask(rollout.entropy, rollout.mask, rho=rho)
  return jnp.where(keep, _grpo(rollout, eps=eps), 0.0)


@register("grpo_surprisal")
def _grpo_surprisal(rollout: Rollout, *, eps: float = 1e-6):
  """GRPO advantages times surprisal weights (mean 1); needs rollout.behaviour_logprobs."""
  rollout.require("behaviour_logprobs", by="grpo_surprisal")
  return _grpo(rollout, eps=eps) * token_credit.surprisal_weights(rollout.behaviour_logprobs,
                                                                  rollout.mask)


@register("n_step")
def _n_step(rollout: Rollout, *, n: int = 8, gamma: float = 1.0, method: str | None = None):
  """A_t = G^(n)_t - V_t with n-step bootstrapped returns; needs rollout.values."""
  rollout.require("values", by="n_step")
  ret = returns.n_step_returns(
      token_level_rewards(rollout), rollout.values, rollout.mask, n=n, gamma=gamma, method=method
  )
  valid = as_bool(rollout.mask)
  return Estimate(advantages=jnp.where(valid, ret - rollout.values, 0.0), returns=ret)


@register("vtrace", needs=("target_logprobs",))
def _vtrace(rollout: Rollout, *, gamma: float = 1.0, lam: float = 1.0, clip_rho: float = 1.0,
            clip_c: float = 1.0, method: str | None = None):
  """V-trace for off-policy (asynchronous) batches: rollout.behaviour_logprobs is the
  behaviour policy, rollout.extras["target_logprobs"] the learner policy."""
  rollout.require("behaviour_logprobs", "values", by="vtrace")
  log_rhos = rollout.extra("target_logprobs", by="vtrace") - rollout.behaviour_logprobs
  vs, pg_advantages = returns.vtrace(
      token_level_rewards(rollout), rollout.values, rollout.mask, log_rhos,
      gamma=gamma, lam=lam, clip_rho=clip_rho, clip_c=clip_c, method=method,
  )
  return Estimate(advantages=pg_advantages, returns=vs)


@register("gae")
def _gae(rollout: Rollout, *, gamma: float = 1.0, lam: float = 0.95, method: str | None = None):
  rollout.require("values", by="gae")
  advantages, rets = returns.gae(
      token_level_rewards(rollout), rollout.values, rollout.mask,
      gamma=gamma, lam=lam, method=method,
  )
  return Estimate(advantages=advantages, returns=rets)


MC_VALUES = ("mc_values", "mc_evaluated")


@register("vineppo", needs=MC_VALUES, settings={"k": 4, "positions": "all"})
def _vineppo(rollout: Rollout):
  """VinePPO (Kazemnejad et al., 2024, arXiv 2410.01679): Monte-Carlo values
  V(s_t) at the positions in extras["mc_evaluated"] (extras["mc_values"], from
  `k` rollouts per position at `positions`, see
  `jaxcredit.credit.monte_carlo`); each segment's V(next point) - V(point) is
  copied to its tokens."""
  return value_credit.segment_advantages(
      rollout.extra("mc_values", by="vineppo"), rollout.extra("mc_evaluated", by="vineppo"),
      rollout.rewards, rollout.mask)


@register("oracle", needs=("oracle_advantages",))
def _oracle(rollout: Rollout):
  """Exact token credit A(s_t, y_t) from extras["oracle_advantages"] (the lab's
  exact oracles, e.g. `jaxcredit.tasks.key_token.oracle.decisive_credit`)."""
  return jnp.where(as_bool(rollout.mask), rollout.extra("oracle_advantages", by="oracle"), 0.0)


@register("oracle_shuffled", needs=("oracle_advantages", "shuffle_priorities"))
def _oracle_shuffled(rollout: Rollout):
  """The exact token credit of each response permuted at random over its own actions
  (the lab's control of `oracle`: the same magnitudes and sum per response, no
  localisation). extras["shuffle_priorities"] [B, T] in [0, 1) draws the permutation:
  the i-th action in position order receives the credit of the action with the i-th
  smallest priority."""
  valid = as_bool(rollout.mask)
  credit = jnp.where(valid, rollout.extra("oracle_advantages", by="oracle_shuffled"), 0.0)
  priorities = rollout.extra("shuffle_priorities", by="oracle_shuffled")
  columns = jnp.arange(valid.shape[1])
  source = jnp.argsort(jnp.where(valid, priorities, 2.0), axis=1)  # actions first, shuffled
  target = jnp.argsort(jnp.where(valid, columns, valid.shape[1] + columns), axis=1)  # in order
  rows = jnp.arange(valid.shape[0])[:, None]
  return jnp.zeros_like(credit).at[rows, target].set(jnp.take_along_axis(credit, source, 1))


@register("oracle_seq", needs=("oracle_values",))
def _oracle_seq(rollout: Rollout):
  """R - V(x) on every token, V from extras["oracle_values"]: the exact
  sequence-level baseline with no localisation (the lab's control)."""
  return value_credit.sequence_advantages(rollout.extra("oracle_values", by="oracle_seq"),
                                          rollout.rewards, rollout.mask)


@register("spo", needs=MC_VALUES, settings={"k": 4, "positions": "cutpoints:0.9"})
def _spo(rollout: Rollout, *, prob_threshold: float = 0.9):
  """SPO-chain (Guo et al., 2025, arXiv 2505.23564): segments start at cutpoints
  (tokens with pi(y_t) < 0.9), each segment's Monte-Carlo V(next cutpoint) -
  V(cutpoint) is carried back over its tokens (extras["mc_values"] /
  ["mc_evaluated"], as for vineppo), and the probability mask zeroes the
  credit of confident tokens (pi(y_t) > prob_threshold)."""
  rollout.require("behaviour_logprobs", by="spo")
  credit = _vineppo(rollout)
  confident = jnp.exp(sanitise(rollout.behaviour_logprobs, as_bool(rollout.mask))) > prob_threshold
  return jnp.where(confident, 0.0, credit)


@register("ktae", needs=("ktae_scores",))
def _ktae(rollout: Rollout, *, eps: float = 1e-6):
  """KTAE (arXiv 2505.16826): the GRPO advantage plus a per-group key-token score
  kappa of each token's type, extras["ktae_scores"] [B, T]
  (`jaxcredit.credit.token_statistics.ktae_scores`: Fisher's exact test and
  information gain of the token's presence against correctness, signed by
  Cohen's h)."""
  scores = rollout.extra("ktae_scores", by="ktae")
  valid = as_bool(rollout.mask)
  return _grpo(rollout, eps=eps) + jnp.where(valid, sanitise(scores, valid), 0.0)


def _turns(rollout: Rollout, by: str) -> tuple:
  """(turn_rewards [B, T], turn_ids [B, T]) of a multi-turn rollout
  (`rollout_sources.MultiTurn`)."""
  rollout.require("turn_ids", by=by)
  return rollout.extra("turn_rewards", by=by), rollout.turn_ids


@register("turn_gae")
def _turn_gae(rollout: Rollout, *, gamma: float = 1.0, lam: float = 0.95,
              method: str | None = None):
  """GAE over turns with a turn critic (`turn_credit.turn_gae`): rollout.values at each
  turn's first action, extras["turn_rewards"], rollout.turn_ids."""
  rollout.require("values", by="turn_gae")
  turn_rewards, turn_ids = _turns(rollout, "turn_gae")
  advantages, rets = turn_credit.turn_gae(turn_rewards, rollout.values, turn_ids, rollout.mask,
                                          gamma=gamma, lam=lam, method=method)
  return Estimate(advantages=advantages, returns=rets)


@register("mt_grpo")
def _mt_grpo(rollout: Rollout, *, outcome_coef: float = 1.0, eps: float = 1e-6,
             scale_by_std: bool = True):
  """MT-GRPO (`turn_credit.mt_grpo_advantages`): group-normalised turn rewards
  (extras["turn_rewards"]) plus outcome_coef times the GRPO advantage of rollout.rewards."""
  turn_rewards, turn_ids = _turns(rollout, "mt_grpo")
  return turn_credit.mt_grpo_advantages(turn_rewards, rollout.rewards, turn_ids, rollout.mask,
                                        group_size=rollout.group_size, outcome_coef=outcome_coef,
                                        eps=eps, scale_by_std=scale_by_std)


@register("gigpo")
def _gigpo(rollout: Rollout, *, step_coef: float = 1.0, gamma: float = 0.95, eps: float = 1e-6,
           scale_by_std: bool = True):
  """GiGPO (`turn_credit.gigpo_advantages`): the episode group's GRPO advantage plus
  step_coef times the step group's, step groups by extras["turn_anchors"] (the
  environment state at each turn's start, `rollout_sources.MultiTurn`)."""
  turn_rewards, turn_ids = _turns(rollout, "gigpo")
  return turn_credit.gigpo_advantages(
      turn_rewards, rollout.rewards, rollout.extra("turn_anchors", by="gigpo"), turn_ids,
      rollout.mask, group_size=rollout.group_size, step_coef=step_coef, gamma=gamma, eps=eps,
      scale_by_std=scale_by_std)


@register("turn_vine", needs=("turn_baselines",), settings={"k": 4})
def _turn_vine(rollout: Rollout):
  """VinePPO over turns: A_k = r_k + V(h_(k+1)) - V(h_k), each turn-start value V(h_k) the
  mean reward from turn k on of `k` continuations branched from the turn's start
  (extras["turn_baselines"], `rollout_sources.MultiTurn.returns_to_go`; V = 0 after the last
  turn): TD(0) over turns on Monte-Carlo values (`turn_credit.turn_gae` with lam = 0).
  An unbiased estimate of the exact turn credit for any k; with many continuations, the
  lab's Monte-Carlo turn oracle where no exact one exists."""
  turn_rewards, turn_ids = _turns(rollout, "turn_vine")
  advantages, _ = turn_credit.turn_gae(
      turn_rewards, rollout.extra("turn_baselines", by="turn_vine"), turn_ids, rollout.mask,
      gamma=1.0, lam=0.0)
  return advantages


@register("turn_baseline", needs=("turn_baselines",), settings={"k": 4})
def _turn_baseline(rollout: Rollout):
  """The rewards from each turn on minus extras["turn_baselines"]: the mean of `k`
  continuations branched from the turn's start (`turn_credit.turn_baseline_advantages`,
  `rollout_sources.MultiTurn.returns_to_go`), an unbiased per-turn baseline."""
  turn_rewards, turn_ids = _turns(rollout, "turn_baseline")
  return turn_credit.turn_baseline_advantages(
      turn_rewards, rollout.extra("turn_baselines", by="turn_baseline"), turn_ids, rollout.mask)
