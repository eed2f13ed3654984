"""Rao-Blackwellised Monte-Carlo credit: the taken action's Q against the other actions'.

With an outcome reward, A_t = Q(s_t, y_t) - V(s_t) and V(s_t) = pi_t Q_y + (1 - pi_t) Q_-,
where Q_- is the mean Q of the actions other than y_t under pi. Hence
A_t = (1 - pi_t)(Q_y - Q_-), with Q_y and Q_- estimated from continuations (those of Q_- with
y_t banned at their first step).

  rb_credit(model, task, tokens, mask, token_valid, examples, key, k=..., logprobs=...)
  rb_advantages(q_taken, q_others, p_taken, se_taken, se_others)   the formula on Q estimates
"""

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit import tasks
from jaxcredit.credit.monte_carlo import MonteCarloStart, returns_stats
from jaxcredit.rollout import Credit

TAKEN_STREAM, BANNED_STREAM = 1, 2  # continuation streams of Q(s_t, y_t) and of Q with y_t banned


def rb_advantages(q_taken: Array, q_others: Array, p_taken: Array, se_taken: Array,
                  se_others: Array) -> tuple[Array, Array]:
  """Rao-Blackwellised credit from Q estimates::

    A  = (1 - pi)(Q_y - Q_-)
    SE = (1 - pi) sqrt(SE_y^2 + SE_-^2)

  Args:
    q_taken: ``[M]`` Q(s_t, y_t).
    q_others: ``[M]`` the mean Q of the other actions under pi (rollouts whose first token
      is drawn with y_t banned).
    p_taken: ``[M]`` pi(y_t | s_t).
    se_taken: ``[M]`` the standard error of `q_taken`.
    se_others: ``[M]`` the standard error of `q_others`.

  Returns:
    ``(advantages, stderr)``, ``[M]`` each.
  """
  weight = 1.0 - p_taken
  return weight * (q_taken - q_others), weight * jnp.sqrt(se_taken**2 + se_others**2)


def rb_credit(model, task: tasks.TrainTask, tokens: np.ndarray, mask: np.ndarray,
              token_valid: np.ndarray, examples: Sequence[dict], key: Array, *, k: int,
              positions: str = "all", logprobs: np.ndarray | None = None, temperature: float = 1.0,
              max_rows: int = 4096) -> Credit:
  """Rao-Blackwellised Monte-Carlo credit at the positions `select_positions` picks.

  ``A_t = (1 - pi_t)(Q_y - Q_-)`` from k continuations of s_t + y_t and k of s_t with y_t
  banned at the first step (`rb_advantages`; 2k rollouts per position); unevaluated actions
  get 0 with adv_stderr 0.

  Args:
    model: the policy that produced the rows (continuations are sampled from it).
    task: the run's `tasks.TrainTask` (rewards, action sets and hidden steps).
    tokens: ``[B, L]`` int rows as the trainer lays them out, L = P + N.
    mask: ``[B, L]`` bool, the actions.
    token_valid: ``[B, L]`` bool, the real tokens.
    examples: the B task examples (for the reward).
    key: a PRNG key; continuations use ``fold_in(key, MC_STREAM)``.
    k: continuations per evaluated state.
    positions: where V is evaluated (`select_positions`' spec).
    logprobs: ``[B, L]`` the behaviour log-probs pi(y_t | s_t), required.
    temperature: the sampling temperature.
    max_rows: continuation rows sampled per call at most.

  Returns:
    a `Credit` of ``[B, L]`` arrays and the rollouts' cost.

  Raises:
    ValueError: without `logprobs`, or as `mc_credit`.
  """
  if logprobs is None:
    raise ValueError("rb_credit needs the behaviour logprobs (pi(y_t | s_t)).")
  start = MonteCarloStart.make(model, task, tokens, mask, token_valid, examples, key, k=k,
                               positions=positions, logprobs=logprobs, temperature=temperature,
                               max_rows=max_rows)
  tokens, mask, rewards, sampler = start.tokens, start.mask, start.rewards, start.sampler
  rows, columns = start.pairs[:, 0], start.pairs[:, 1]
  last_action = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
  last = columns == last_action[rows]
  q_y, se_y = returns_stats(sampler.returns(np.stack([rows, columns + 1], 1), stream=TAKEN_STREAM))
  q_y, se_y = np.where(last, rewards[rows], q_y), np.where(last, 0.0, se_y)  # Q(s_T-1, y) = R
  q_minus, se_minus = returns_stats(
      sampler.returns(start.pairs, ban=tokens[rows, columns], stream=BANNED_STREAM))
  p_taken = np.exp(np.asarray(logprobs, np.float64)[rows, columns])
  adv, se = (np.asarray(x) for x in rb_advantages(q_y, q_minus, p_taken, se_y, se_minus))
  advantages, adv_stderr, values = (np.zeros(tokens.shape) for _ in range(3))
  advantages[rows, columns], adv_stderr[rows, columns] = adv, se
  values[rows, columns] = p_taken * q_y + (1 - p_taken) * q_minus  # an unbiased V(s_t)
  return Credit(advantages=jnp.asarray(advantages, jnp.float32),
                values=jnp.asarray(values, jnp.float32),
                adv_stderr=jnp.asarray(adv_stderr, jnp.float32),
                evaluated=jnp.asarray(start.evaluated),
                cost=sampler.cost())
