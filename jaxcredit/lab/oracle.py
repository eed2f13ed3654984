"""Oracle token credit A(s_t, y_t) = Q(s_t, y_t) - V(s_t) under the policy that
sampled a batch: exact on key_token (filler-blind), Monte Carlo anywhere.

Rows use the training layout: [B, L] with L = P + N (a left-padded prompt,
then N response slots); `mask` marks actions. With gamma = 1 and an outcome
reward R, A_t = V(s_{t+1}) - V(s_t) and V after the last action is R.

  decisive_credit(model, task_config, tokens, mask, targets)   exact (E-DEC, LAB.md 1.1)
  exact_success(model, task_config, prompts, targets)          exact V(x), J(pi) = its mean
  mc_credit(model, task, tokens, mask, token_valid, examples, key, k=..., positions=...)
                                                                plain Monte Carlo (VinePPO)
  rb_credit(..., logprobs=...)                                  Rao-Blackwellised Monte Carlo

The Monte-Carlo machinery (`mc_credit`, `select_positions`, `mc_value_stats`)
lives in `jaxcredit.train.monte_carlo`, where VinePPO training uses it.
"""

import itertools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from jaxcredit.sampling import mask_logits
from jaxcredit.tasks import key_token
from jaxcredit.train import monte_carlo, tasks
from jaxcredit.train.monte_carlo import (Credit, mc_credit, mc_value_stats, returns_stats,
                                         select_positions)

TAKEN_STREAM, BANNED_STREAM = 1, 2  # continuation streams of Q(s_t, y_t) and of Q with y_t banned

__all__ = ["Credit", "decisive_credit", "exact_success", "mc_credit", "mc_value_stats",
           "rb_advantages", "rb_credit", "select_positions"]


def _teacher_forced_logprobs(model, inputs: np.ndarray, allowed: np.ndarray) -> np.ndarray:
  """[n, L, V] float64: [:, i] is log pi(. | inputs[:, :i + 1]), the distribution
  of token i + 1, restricted to allowed[i + 1] (allowed: [L, V] over row columns)."""
  allowed_next = np.concatenate([allowed[1:], np.ones_like(allowed[:1])])
  return np.asarray(_masked_log_softmax(model, jnp.asarray(inputs), jnp.asarray(allowed_next)),
                    np.float64)


@nnx.jit
def _masked_log_softmax(model, inputs: Array, allowed_next: Array) -> Array:
  positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
  out = model(inputs, positions=positions, token_valid=jnp.ones(inputs.shape, bool))
  return jax.nn.log_softmax(mask_logits(out.logits.astype(jnp.float32), allowed_next), axis=-1)


def decisive_credit(model, config: key_token.KeyTokenConfig, tokens: np.ndarray, mask: np.ndarray,
                    targets: np.ndarray) -> Credit:
  """Exact credit on filler-blind key_token (E-DEC, LAB.md 1.1), temperature 1.

  tokens, mask: [B, L] rows (prompt K + 2 ids, then the T response ids);
  targets: [B, K] the keys each row must copy. The policy's conditional at
  decisive position p_k depends only on the prompt and the decisive tokens
  before it (filler is hidden), so one teacher-forced pass per prefix
  u in C^(K-1) per distinct prompt gives every conditional; values are backed
  up in float64: W(u) = sum_c pi(c | x, u) W(u + c), leaves W = R.
  V(s_t) = W(d_1..d_k(t)); A = W(d_<=k) - W(d_<k) at p_k and 0 on filler.
  """
  if not config.filler_blind:
    raise ValueError("decisive_credit is exact only for filler_blind key_token; use mc_credit.")
  tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
  prompt_len, length = config.prompt_length, config.length
  if tokens.shape[1] != prompt_len + length:
    raise ValueError(f"Expected rows of {prompt_len} + {length} tokens, got {tokens.shape}.")
  positions = config.decisive_positions
  keys = [int(c) for c in config.keys]
  allowed = key_token.allowed_in_rows(config)
  prefixes = list(itertools.product(keys, repeat=config.n_decisive - 1))
  values = np.zeros(tokens.shape)
  advantages = np.zeros(tokens.shape)
  prompts, inverse = np.unique(tokens[:, :prompt_len], axis=0, return_inverse=True)
  passes = 0
  for p, prompt in enumerate(prompts):
    rows = np.flatnonzero(inverse.reshape(-1) == p)
    response = np.full((len(prefixes), length), key_token.FILL)
    for i, u in enumerate(prefixes):
      response[i, positions] = [*u, keys[0]]
    logp = _teacher_forced_logprobs(
        model, np.concatenate([np.tile(prompt, (len(prefixes), 1)), response], 1), allowed)
    passes += len(prefixes)
    # pi(c | x, u_<k) for every prefix u_<k of length k < K.
    conditional = {}
    for i, u in enumerate(prefixes):
      for k in range(config.n_decisive):
        column = prompt_len + positions[k] - 1
        conditional[tuple(u[:k])] = {c: math.exp(logp[i, column, c]) for c in keys}
    target = targets[rows[0]][None]
    leaf = lambda d: float(key_token.reward(_placed(d, positions, length)[None], target, config)[0])
    memo = {}

    def value(u: tuple) -> float:
      if u not in memo:
        memo[u] = leaf(u) if len(u) == config.n_decisive else sum(
            prob * value(u + (c,)) for c, prob in conditional[u].items())
      return memo[u]

    for row in rows:
      decided = [int(tokens[row, prompt_len + q]) for q in positions]
      counts = np.searchsorted(positions, np.arange(length), side="left")  # k(t) = #{p < t}
      values[row, prompt_len:] = [value(tuple(decided[:k])) for k in counts]
      for k, q in enumerate(positions):
        advantages[row, prompt_len + q] = value(tuple(decided[:k + 1])) - value(tuple(decided[:k]))
  values, advantages = np.where(mask, values, 0.0), np.where(mask, advantages, 0.0)
  return Credit(
      advantages=jnp.asarray(advantages, jnp.float32), values=jnp.asarray(values, jnp.float32),
      adv_stderr=jnp.zeros(tokens.shape, jnp.float32), evaluated=jnp.asarray(mask),
      cost={"passes": passes, "tf_tokens": passes * tokens.shape[1], "rollouts": 0, "gen_tokens": 0,
            "prefill_tokens": 0},
  )


def exact_success(model, config: key_token.KeyTokenConfig, prompts: np.ndarray,
                  targets: np.ndarray) -> np.ndarray:
  """[n] float64 V^pi(x) = E_pi[R | x] of each prompt at temperature 1, exactly
  (filler-blind key_token): the value `decisive_credit` backs up to the start of the
  response. Its mean over held-out prompts is the policy's expected success J(pi),
  free of the sampling noise of a measured accuracy.

  prompts: [n, K + 2] prompt ids; targets: [n, K] the keys each must copy."""
  prompts = np.asarray(prompts)
  response = np.full((len(prompts), config.length), key_token.FILL)  # any valid response: V(x)
  response[:, config.decisive_positions] = config.keys[0]          # is read before its first token
  rows = np.concatenate([prompts, response], 1)
  mask = np.zeros(rows.shape, bool)
  mask[:, config.prompt_length:] = True
  credit = decisive_credit(model, config, rows, mask, np.asarray(targets))
  return np.asarray(credit.values, np.float64)[:, config.prompt_length]


def _placed(decisive: Sequence[int], positions: np.ndarray, length: int) -> np.ndarray:
  """A [T] response (zeros off P) holding `decisive` at the decisive positions."""
  response = np.zeros(length, np.int64)
  response[positions] = decisive
  return response


def rb_advantages(q_taken: Array, q_others: Array, p_taken: Array, se_taken: Array,
                  se_others: Array) -> tuple[Array, Array]:
  """Rao-Blackwellised credit (LAB.md 1.3, fact F2): A = (1 - pi)(Q_y - Q_-),
  SE = (1 - pi) sqrt(SE_y^2 + SE_-^2). q_taken: Q(s_t, y_t); q_others: the
  mean Q of the other actions under pi (rollouts whose first token is drawn
  with y_t banned); p_taken: pi(y_t | s_t). All [M]."""
  weight = 1.0 - p_taken
  return weight * (q_taken - q_others), weight * jnp.sqrt(se_taken**2 + se_others**2)


def rb_credit(model, task: tasks.TrainTask, tokens: np.ndarray, mask: np.ndarray,
              token_valid: np.ndarray, examples: Sequence[dict], key: Array, *, k: int,
              positions: str = "all", logprobs: np.ndarray | None = None, temperature: float = 1.0,
              max_rows: int = 4096) -> Credit:
  """Rao-Blackwellised Monte-Carlo credit at the positions `select_positions` picks:
  A_t = (1 - pi_t)(Q_y - Q_-) from k continuations of s_t + y_t and k of s_t
  with y_t banned at the first step (`rb_advantages`; 2k rollouts per
  position); unevaluated actions get 0 with adv_stderr 0. Arguments as
  `mc_credit`; `logprobs` (pi(y_t | s_t)) is required."""
  if logprobs is None:
    raise ValueError("rb_credit needs the behaviour logprobs (pi(y_t | s_t)).")
  start = monte_carlo.MonteCarloStart.make(model, task, tokens, mask, token_valid, examples, key,
                                           k=k, positions=positions, logprobs=logprobs,
                                           temperature=temperature, max_rows=max_rows)
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
