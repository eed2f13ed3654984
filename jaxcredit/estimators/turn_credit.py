"""Turn-level credit for multi-turn episodes (the layout of `rollout_sources.MultiTurn`).

A turn is the run of action tokens (mask True) that share a turn id
(turn_ids [B, T], non-decreasing along a row, -1 outside turns). Its first
action token is its *step*: turn-level quantities live there, and a turn's
advantage is given to every one of its action tokens. Observation tokens
(mask 0) between turns get 0, like any masked position.

  turn_gae            GAE over turns with a turn critic: the value at each
                      turn's first action token (Turn-PPO, arXiv 2512.17008).
  mt_grpo_advantages  group-normalised turn rewards plus the outcome advantage
                      (MT-GRPO, arXiv 2505.11821).
  gigpo_advantages    episode groups plus step groups of identical anchor states
                      (GiGPO, arXiv 2505.10978).
  turn_baseline_advantages
                      the rewards from turn k on minus a baseline of turn k that
                      depends only on the history before it (the mean of
                      continuations branched from the turn's start): unbiased.

turn_rewards [B, T] holds each turn's reward on its tokens (`MultiTurn` puts
it on the turn's last action; what matters is the sum over the turn).
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, safe_divide, safe_sqrt
from jaxcredit.estimators import group, returns


def turn_starts(turn_ids: Array, mask: Array) -> Array:
  """The first action token of each turn: a valid token whose turn id exceeds every earlier
  valid token's.

  Args:
    turn_ids: ``[B, T]`` int, non-decreasing along a row, -1 outside turns.
    mask: ``[B, T]`` policy actions.

  Returns:
    bool ``[B, T]``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import turn_credit
    >>> turn_credit.turn_starts(jnp.array([[0, 0, -1, 1, 1]]),
    ...                         jnp.array([[True, True, False, True, True]]))
    Array([[ True, False, False,  True, False]], dtype=bool)
  """
  valid = as_bool(mask)
  ids = jnp.where(valid, turn_ids, -1)
  before = jnp.pad(jax.lax.cummax(ids, axis=1)[:, :-1], [(0, 0), (1, 0)], constant_values=-1)
  return valid & (ids > before)


def _start_of(starts: Array) -> Array:
  """[B, T] int: the position of the latest turn start at or before t (0 before any)."""
  positions = jnp.arange(starts.shape[1])[None]
  return jax.lax.cummax(jnp.where(starts, positions, 0), axis=1)


def sum_to_starts(x: Array, starts: Array, valid: Array) -> Array:
  """Each turn's sum of `x` over its valid tokens, placed at the turn's start.

  Args:
    x: ``[B, T]`` per-token values.
    starts: ``[B, T]`` bool, from `turn_starts`.
    valid: ``[B, T]`` bool, the action tokens.

  Returns:
    float32 ``[B, T]``, 0 off the turn starts.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import turn_credit
    >>> valid = jnp.ones((1, 4), bool)
    >>> starts = turn_credit.turn_starts(jnp.array([[0, 0, 1, 1]]), valid)
    >>> turn_credit.sum_to_starts(jnp.array([[1.0, 2.0, 3.0, 4.0]]), starts, valid)
    Array([[3., 0., 7., 0.]], dtype=float32)
  """
  values = jnp.where(valid, x.astype(jnp.float32), 0.0)
  summed = jax.vmap(lambda v, i: jnp.zeros(v.shape, v.dtype).at[i].add(v))(values,
                                                                           _start_of(starts))
  return jnp.where(starts, summed, 0.0)


def spread_over_turns(at_starts: Array, starts: Array, valid: Array) -> Array:
  """The value at each turn's start on every valid token of the turn.

  Args:
    at_starts: ``[B, T]`` values read at the turn starts.
    starts: ``[B, T]`` bool, from `turn_starts`.
    valid: ``[B, T]`` bool, the action tokens.

  Returns:
    ``[B, T]``, 0 off the action tokens.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import turn_credit
    >>> valid = jnp.ones((1, 4), bool)
    >>> starts = turn_credit.turn_starts(jnp.array([[0, 0, 1, 1]]), valid)
    >>> turn_credit.spread_over_turns(jnp.array([[5.0, 0.0, 7.0, 0.0]]), starts, valid)
    Array([[5., 5., 7., 7.]], dtype=float32)
  """
  return jnp.where(valid, jnp.take_along_axis(at_starts, _start_of(starts), axis=1), 0.0)


def turn_gae(turn_rewards: Array, values: Array, turn_ids: Array, mask: Array, *, gamma: float,
             lam: float, method: str | None = None) -> tuple[Array, Array]:
  """GAE over turns (one step per turn) with a turn critic::

    r_k = sum of turn k's rewards,   V_k = values at turn k's first action token
    delta_k = r_k + gamma V_(k+1) - V_k,   A_k = delta_k + gamma lam A_(k+1)

  with V_K = A_K = 0 after the last turn. Every token of turn k gets A_k and the value
  target A_k + V_k.

  Args:
    turn_rewards: ``[B, T]`` each turn's reward on its tokens.
    values: ``[B, T]`` the turn critic's values (read at turn starts).
    turn_ids: ``[B, T]`` int turn ids, -1 outside turns.
    mask: ``[B, T]`` policy actions.
    gamma: discount per turn in ``[0, 1]``.
    lam: GAE lambda in ``[0, 1]``.
    method: recurrence method (`recurrence.METHODS`), None for the backend's default.

  Returns:
    ``(advantages, returns)``, float32 ``[B, T]`` each, 0 off the action tokens.

  Raises:
    ValueError: on mismatched shapes or discounts outside ``[0, 1]``.

  References:
    Turn-PPO, arXiv 2512.17008; Schulman et al., 2016, "High-Dimensional Continuous Control
    Using Generalized Advantage Estimation", arXiv 1506.02438.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> turn_ids, mask = jnp.array([[0, 0, 1, 1]]), jnp.ones((1, 4), bool)
    >>> advantages, returns = estimators.turn_gae(jnp.array([[0.0, 0.0, 0.0, 1.0]]),
    ...     jnp.array([[0.5, 0.0, 0.75, 0.0]]), turn_ids, mask, gamma=1.0, lam=1.0)
    >>> advantages.round(4)
    Array([[0.5 , 0.5 , 0.25, 0.25]], dtype=float32)
  """
  _checks.check_token_and_seq(
      {"turn_rewards": turn_rewards, "values": values, "turn_ids": turn_ids, "mask": mask}, {})
  valid = as_bool(mask)
  starts = turn_starts(turn_ids, valid)
  advantages, targets = returns.gae(sum_to_starts(turn_rewards, starts, valid), values, starts,
                                    gamma=gamma, lam=lam, method=method)
  return spread_over_turns(advantages, starts, valid), spread_over_turns(targets, starts, valid)


def mt_grpo_advantages(turn_rewards: Array, rewards: Array, turn_ids: Array, mask: Array, *,
                       group_size: int, outcome_coef: float = 1.0, eps: float = 1e-6,
                       scale_by_std: bool = True) -> Array:
  """MT-GRPO, for any number of turns::

    A_(i, k) = A^T_(i, k) + outcome_coef * A^O_i     on the tokens of turn k of row i

  A^O is the GRPO advantage of the episode rewards; A^T_(i, k) is turn k's reward normalised
  over the rows of i's group that have a turn k (GRPO's normalisation; 0 where fewer than 2
  rows have it or their rewards are equal). With two turns and no reward on the last this is
  the paper's A_1 = A^T + lambda A^O, A_2 = A^O.

  Args:
    turn_rewards: ``[B, T]`` each turn's reward on its tokens.
    rewards: ``[B]`` episode rewards.
    turn_ids: ``[B, T]`` int turn ids, -1 outside turns.
    mask: ``[B, T]`` policy actions.
    group_size: G, episodes per prompt.
    outcome_coef: the weight of the outcome advantage.
    eps: added to the stds.
    scale_by_std: divide by the stds (GRPO) or not (Dr. GRPO).

  Returns:
    float32 ``[B, T]``, 0 off the action tokens.

  Raises:
    ValueError: on mismatched shapes or when `group_size` does not divide B.

  References:
    Zeng et al., 2025, "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit
    Assignment", arXiv 2505.11821.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> turn_ids, mask = jnp.array([[0, 1], [0, 1]]), jnp.ones((2, 2), bool)
    >>> turn_rewards = jnp.array([[1.0, 0.0], [0.0, 0.0]])
    >>> estimators.mt_grpo_advantages(turn_rewards, jnp.array([1.0, 0.0]), turn_ids, mask,
    ...                                group_size=2).round(4)
    Array([[ 1.4142,  0.7071],
           [-1.4142, -0.7071]], dtype=float32)
  """
  _checks.check_token_and_seq({"turn_rewards": turn_rewards, "turn_ids": turn_ids, "mask": mask},
                              {"rewards": rewards})
  valid = as_bool(mask)
  _checks.check_group_size(mask.shape[0], group_size)
  starts = turn_starts(turn_ids, valid)
  turns = _step_group_normalised(sum_to_starts(turn_rewards, starts, valid), starts, turn_ids,
                                 group_size, eps, scale_by_std)
  outcome = group.grpo_advantages(rewards, group_size=group_size, eps=eps,
                                  scale_by_std=scale_by_std)
  return jnp.where(valid, spread_over_turns(turns, starts, valid) + outcome_coef * outcome[:, None],
                   0.0)


def gigpo_advantages(turn_rewards: Array, rewards: Array, anchors: Array, turn_ids: Array,
                     mask: Array, *, group_size: int, step_coef: float = 1.0, gamma: float = 0.95,
                     eps: float = 1e-6, scale_by_std: bool = True) -> Array:
  """GiGPO: episode groups plus step groups of identical anchor states::

    A = A^E_i + step_coef * A^S_(i, k)

  A^E is the GRPO advantage of the episode rewards over each group. The step group of turn k
  of row i is every turn, of any row of i's group and at any step, whose anchor state equals
  its own; within it the discounted return from the turn, ``R_k = sum_(j >= k) gamma^(j - k)
  r_j``, is normalised like GRPO (0 for a step group of one, or of equal returns).

  Args:
    turn_rewards: ``[B, T]`` each turn's reward on its tokens.
    rewards: ``[B]`` episode rewards.
    anchors: ``[B, T]`` int, an id of the environment state at the turn's start, read at its
      first action token.
    turn_ids: ``[B, T]`` int turn ids, -1 outside turns.
    mask: ``[B, T]`` policy actions.
    group_size: G, episodes per prompt.
    step_coef: the weight of the step advantage.
    gamma: discount per turn of the step returns.
    eps: added to the stds.
    scale_by_std: divide by the stds (GRPO) or not (Dr. GRPO).

  Returns:
    float32 ``[B, T]``, 0 off the action tokens.

  Raises:
    ValueError: on mismatched shapes or when `group_size` does not divide B.

  References:
    Feng et al., 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
    arXiv 2505.10978.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> turn_ids, mask = jnp.array([[0, 1], [0, 1]]), jnp.ones((2, 2), bool)
    >>> anchors = jnp.array([[0, 1], [0, 2]])  # both episodes start in state 0
    >>> turn_rewards = jnp.array([[0.0, 1.0], [0.0, 0.0]])
    >>> estimators.gigpo_advantages(turn_rewards, jnp.array([1.0, 0.0]), anchors, turn_ids, mask,
    ...                              group_size=2, gamma=1.0).round(4)
    Array([[ 1.4142,  0.7071],
           [-1.4142, -0.7071]], dtype=float32)
  """
  _checks.check_token_and_seq(
      {"turn_rewards": turn_rewards, "anchors": anchors, "turn_ids": turn_ids, "mask": mask},
      {"rewards": rewards})
  valid = as_bool(mask)
  batch, length = mask.shape
  _checks.check_group_size(batch, group_size)
  starts = turn_starts(turn_ids, valid)
  step_returns = returns.discounted_returns(sum_to_starts(turn_rewards, starts, valid), starts,
                                            gamma=gamma)
  step = _step_group_normalised(step_returns, starts, anchors, group_size, eps, scale_by_std)
  episode = group.grpo_advantages(rewards, group_size=group_size, eps=eps,
                                  scale_by_std=scale_by_std)
  return jnp.where(valid, episode[:, None] + step_coef * spread_over_turns(step, starts, valid),
                   0.0)


def _step_group_normalised(values: Array, starts: Array, anchors: Array, group_size: int,
                           eps: float, scale_by_std: bool) -> Array:
  """[B, T]: `values` at turn starts, normalised like GRPO over their step groups (turn
  starts of one row group with equal anchors; std ddof 1, 0 for a step group of one or of
  equal values). A sort by (not a start, row group, anchor) makes each step group one
  contiguous run of the flattened batch."""
  _checks.check_in_range(eps, "eps", low=0.0)
  batch, length = starts.shape
  n = batch * length
  row_group = jnp.broadcast_to((jnp.arange(batch) // group_size)[:, None], (batch, length))
  keys = ((~starts).reshape(-1).astype(jnp.int32), row_group.reshape(-1),
          anchors.reshape(-1).astype(jnp.int32))
  *keys, values, order = jax.lax.sort(
      (*keys, values.reshape(-1).astype(jnp.float32), jnp.arange(n)), num_keys=3)
  begins = jnp.concatenate([jnp.ones(1, bool), jnp.any(jnp.stack([k[1:] != k[:-1] for k in keys]),
                                                        axis=0)])
  run = jnp.cumsum(begins) - 1
  present = keys[0] == 0
  per_run = lambda x: jax.ops.segment_sum(x, run, n)[run]
  count = per_run(present.astype(jnp.float32))
  # Differences to the run's first value: equal values centre to exactly 0.
  first = jax.lax.cummax(jnp.where(begins, jnp.arange(n), 0))
  shifted = jnp.where(present, values - values[first], 0.0)
  magnitude = jax.ops.segment_max(jnp.abs(shifted), run, n)[run]
  scale = jnp.maximum(jax.lax.stop_gradient(magnitude), 1.0)
  shifted = shifted / scale  # no overflow in the squares below
  centred = jnp.where(present, shifted - safe_divide(per_run(shifted), count), 0.0)
  if scale_by_std:
    normalised = safe_divide(centred, safe_sqrt(safe_divide(per_run(centred**2), count - 1.0))
                             + eps / scale)
  else:
    normalised = centred * scale
  normalised = jnp.where(present & (count > 1), normalised, 0.0)
  return jnp.zeros(n, jnp.float32).at[order].set(normalised).reshape(batch, length)


def turn_baseline_advantages(turn_rewards: Array, baselines: Array, turn_ids: Array,
                             mask: Array) -> Array:
  """Turn returns minus a history baseline::

    A_k = G_k - b_k,    G_k = sum_(j >= k) r_j

  on every token of turn k, with b_k the baseline at turn k's first action token. When b_k
  is a function of the history before turn k only (e.g. the mean return of continuations
  branched from the turn's start, `rollout_sources.MultiTurn.returns_to_go`),
  E[A_k | history] = 0: the baseline adds no bias, for any number of turns.

  Args:
    turn_rewards: ``[B, T]`` each turn's reward on its tokens.
    baselines: ``[B, T]`` b_k, read at turn starts.
    turn_ids: ``[B, T]`` int turn ids, -1 outside turns.
    mask: ``[B, T]`` policy actions.

  Returns:
    float32 ``[B, T]``, 0 off the action tokens.

  Raises:
    ValueError: on mismatched shapes.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.turn_baseline_advantages(jnp.array([[0.0, 1.0]]), jnp.array([[0.25, 0.5]]),
    ...                                      jnp.array([[0, 1]]), jnp.ones((1, 2), bool))
    Array([[0.75, 0.5 ]], dtype=float32)
  """
  _checks.check_token_and_seq(
      {"turn_rewards": turn_rewards, "baselines": baselines, "turn_ids": turn_ids, "mask": mask},
      {})
  valid = as_bool(mask)
  starts = turn_starts(turn_ids, valid)
  to_go = returns.discounted_returns(sum_to_starts(turn_rewards, starts, valid), starts, gamma=1.0)
  return spread_over_turns(jnp.where(starts, to_go - jnp.where(starts, baselines, 0.0), 0.0),
                           starts, valid)
