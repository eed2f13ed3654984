"""Oracle token credit A(s_t, y_t) = Q(s_t, y_t) - V(s_t) under the policy that
sampled a batch: exact on key_token (filler-blind), Monte Carlo anywhere.

Rows use the training layout: [B, L] with L = P + N (a left-padded prompt,
then N response slots); `mask` marks actions. With gamma = 1 and an outcome
reward R, A_t = V(s_{t+1}) - V(s_t) and V after the last action is R.

  decisive_credit(model, task_config, tokens, mask, targets)   exact (E-DEC)
  exact_success(model, task_config, prompts, targets)          exact V(x), J(pi) = its mean
  decisive_values / credit_from_values                         the same, traceable (jit, vmap)
  mc_credit(model, task, tokens, mask, token_valid, examples, key, k=..., positions=...)
                                                                plain Monte Carlo (VinePPO)
  rb_credit(..., logprobs=...)                                  Rao-Blackwellised Monte Carlo

The Monte-Carlo machinery (`mc_credit`, `select_positions`, `mc_value_stats`)
lives in `jaxcredit.credit.monte_carlo`, where VinePPO training uses it.
"""

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from jaxcredit import tasks
from jaxcredit.credit import monte_carlo
from jaxcredit.sampling import mask_logits
from jaxcredit.tasks import key_token
from jaxcredit.credit.monte_carlo import (Credit, mc_credit, mc_value_stats, returns_stats,
                                         select_positions)

TAKEN_STREAM, BANNED_STREAM = 1, 2  # continuation streams of Q(s_t, y_t) and of Q with y_t banned

__all__ = ["Credit", "credit_from_values", "decisive_credit", "decisive_values", "exact_success",
           "mc_credit", "mc_value_stats", "rb_advantages", "rb_credit", "select_positions"]


def _teacher_forced_logprobs(model, inputs: np.ndarray, allowed: np.ndarray) -> np.ndarray:
  """[n, L, V] float64: [:, i] is log pi(. | inputs[:, :i + 1]), the distribution
  of token i + 1, restricted to allowed[i + 1] (allowed: [L, V] over row columns)."""
  allowed_next = np.concatenate([allowed[1:], np.ones_like(allowed[:1])])
  return np.asarray(_jitted_log_softmax(model, jnp.asarray(inputs), jnp.asarray(allowed_next)),
                    np.float64)


def _masked_log_softmax(model, inputs: Array, allowed_next: Array) -> Array:
  positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
  out = model(inputs, positions=positions, token_valid=jnp.ones(inputs.shape, bool))
  return jax.nn.log_softmax(mask_logits(out.logits.astype(jnp.float32), allowed_next), axis=-1)


_jitted_log_softmax = nnx.jit(_masked_log_softmax)


def decisive_values(model, config: key_token.KeyTokenConfig, prompts: Array,
                    targets: Array) -> list[Array]:
  """The exact value tree of filler-blind key_token (E-DEC) at temperature 1;
  traceable (jit, vmap over seeds).

  prompts: [n, K + 2] prompt ids; targets: [n, K] the key ids each must copy. Returns
  [W_0, ..., W_K], W_k: [n, |C|^k] float32, W_k[i, u] = E[R | x_i, the first k decisive
  tokens are u], u a lexicographic index over C (key index = id - KEY0). The policy's
  conditional at decisive position p_k depends only on the prompt and the decisive tokens
  before it (filler is hidden), so one teacher-forced pass over |C|^(K-1) rows per prompt
  (decisive prefixes, FILL elsewhere) gives every conditional pi(c | x, u_<k); then
  W_K(u) = R(u) (the rule) and W_k(u) = sum_c pi(c | x, u) W_(k+1)(u c).
  """
  _check_exact(config)
  n_keys, n_decisive, prompt_len = config.n_keys, config.n_decisive, config.prompt_length
  positions = config.decisive_positions
  prefixes = np.asarray(list(itertools.product(range(n_keys), repeat=n_decisive - 1)),
                        np.int32).reshape(-1, n_decisive - 1)  # [M, K - 1], M = |C|^(K-1)
  response = np.full((len(prefixes), config.length), key_token.FILL, np.int32)
  response[:, positions[:-1]] = key_token.KEY0 + prefixes
  response[:, positions[-1]] = key_token.KEY0
  n = prompts.shape[0]
  rows = jnp.concatenate([jnp.repeat(jnp.asarray(prompts, jnp.int32), len(prefixes), axis=0),
                          jnp.tile(jnp.asarray(response), (n, 1))], axis=1)
  allowed = key_token.allowed_in_rows(config)
  logp = _masked_log_softmax(model, rows, np.concatenate([allowed[1:], np.ones_like(allowed[:1])]))
  # [n, M, K, |C|]: pi(. | x, prefix) at each decisive position.
  probs = jnp.exp(logp[:, prompt_len + positions - 1][..., config.keys]).reshape(
      n, len(prefixes), n_decisive, n_keys)
  leaves = np.asarray(list(itertools.product(range(n_keys), repeat=n_decisive)), np.int32)
  tree = [key_token.rule_reward(key_token.KEY0 + jnp.asarray(leaves)[None],
                                jnp.asarray(targets)[:, None], config)]
  for k in reversed(range(n_decisive)):
    # The row whose first k decisive tokens are u (index j) and whose others are C[0]: j C^(K-1-k).
    conditional = probs[:, np.arange(n_keys**k) * n_keys**(n_decisive - 1 - k), k]
    tree.insert(0, jnp.sum(conditional * tree[0].reshape(n, n_keys**k, n_keys), axis=-1))
  return tree


def credit_from_values(tree: Sequence[Array], decided: Array,
                       config: key_token.KeyTokenConfig) -> tuple[Array, Array]:
  """Exact (values, advantages) [B, T] over the response positions of B responses whose
  decisive tokens are `decided` [B, K] (ids), from each row's value tree `tree` (W_k [B,
  |C|^k], `decisive_values` gathered per row): V(s_t) = W_k(t)(d_<k(t)) with k(t) = #{p < t};
  A = W_(k+1)(d_<=k) - W_k(d_<k) at p_k and 0 on filler. Traceable."""
  n_keys, n_decisive = config.n_keys, config.n_decisive
  index, after = jnp.zeros(decided.shape[0], jnp.int32), [tree[0][:, 0]]
  for k in range(n_decisive):
    index = index * n_keys + (decided[:, k] - key_token.KEY0)
    after.append(jnp.take_along_axis(tree[k + 1], index[:, None], axis=1)[:, 0])
  after = jnp.stack(after, axis=1)  # [B, K + 1]: the value after the first k decisive tokens
  decided_before = np.searchsorted(config.decisive_positions, np.arange(config.length), "left")
  advantages = jnp.zeros((decided.shape[0], config.length), after.dtype).at[
      :, config.decisive_positions].set(after[:, 1:] - after[:, :-1])
  return after[:, decided_before], advantages


def decisive_credit(model, config: key_token.KeyTokenConfig, tokens: np.ndarray, mask: np.ndarray,
                    targets: np.ndarray) -> Credit:
  """Exact credit on filler-blind key_token (E-DEC), temperature 1: the value
  tree of each distinct prompt (`decisive_values`, one batched pass) read along each row's
  decisive tokens (`credit_from_values`).

  tokens, mask: [B, L] rows (prompt K + 2 ids, then the T response ids); targets: [B, K]
  the keys each row must copy. Values and advantages are 0 off `mask`.
  """
  _check_exact(config)
  tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
  prompt_len = config.prompt_length
  if tokens.shape[1] != prompt_len + config.length:
    raise ValueError(f"Expected rows of {prompt_len} + {config.length} tokens, got "
                     f"{tokens.shape}.")
  prompts, first, inverse = np.unique(tokens[:, :prompt_len], axis=0, return_index=True,
                                      return_inverse=True)
  tree = _jitted_values(model, config, prompts, np.asarray(targets)[first])
  tree = [w[inverse.reshape(-1)] for w in tree]
  response = tokens[:, prompt_len:]
  values, advantages = (
      np.concatenate([np.zeros((len(tokens), prompt_len)), np.asarray(x, np.float64)], 1)
      for x in credit_from_values(tree, jnp.asarray(response[:, config.decisive_positions]),
                                  config))
  values, advantages = np.where(mask, values, 0.0), np.where(mask, advantages, 0.0)
  passes = len(prompts) * config.n_keys**(config.n_decisive - 1)
  return Credit(
      advantages=jnp.asarray(advantages, jnp.float32), values=jnp.asarray(values, jnp.float32),
      adv_stderr=jnp.zeros(tokens.shape, jnp.float32), evaluated=jnp.asarray(mask),
      cost={"passes": passes, "tf_tokens": passes * tokens.shape[1], "rollouts": 0, "gen_tokens": 0,
            "prefill_tokens": 0},
  )


def tree_credit_rows(tokens: np.ndarray, mask: np.ndarray, prompt_len: int, *, per_prompt: int,
                     path_length: int, max_passes: int, advice: str, credit_of) -> Credit:
  """The Credit of an E-TREE oracle (`tree_oracle`, `sum_tree`) on [B, L] rows: the tree of
  each distinct prompt costs `per_prompt` teacher-forced paths of `path_length` tokens;
  more than `max_passes` in all is refused (ValueError with the count and `advice`).
  credit_of(prompts [n, P], first [n] a row of each, inverse [B] each row's prompt) returns
  (values, advantages) [B, L - P] of the response columns; they are placed after the
  prompt columns, 0 off `mask`."""
  prompts, first, inverse = np.unique(tokens[:, :prompt_len], axis=0, return_index=True,
                                      return_inverse=True)
  passes = len(prompts) * per_prompt
  if passes > max_passes:
    raise ValueError(f"E-TREE needs {passes:,} teacher-forced paths ({len(prompts)} prompts x "
                     f"{per_prompt:,}), over max_passes = {max_passes:,}: {advice}.")
  values, advantages = (np.asarray(x, np.float64)
                        for x in credit_of(prompts, first, inverse.reshape(-1)))
  rows = lambda x: jnp.asarray(np.where(
      mask, np.concatenate([np.zeros((len(tokens), prompt_len)), x], 1), 0.0), jnp.float32)
  return Credit(advantages=rows(advantages), values=rows(values),
                adv_stderr=jnp.zeros(tokens.shape, jnp.float32), evaluated=jnp.asarray(mask),
                cost={"passes": passes, "tf_tokens": passes * path_length, "rollouts": 0,
                      "gen_tokens": 0, "prefill_tokens": 0})


def exact_success(model, config: key_token.KeyTokenConfig, prompts: np.ndarray,
                  targets: np.ndarray) -> np.ndarray:
  """[n] float64 V^pi(x) = E_pi[R | x] of each prompt at temperature 1, exactly
  (filler-blind key_token): the root of its value tree (`decisive_values`). Its mean over
  held-out prompts is the policy's expected success J(pi), free of the sampling noise of a
  measured accuracy.

  prompts: [n, K + 2] prompt ids; targets: [n, K] the keys each must copy."""
  tree = _jitted_values(model, config, np.asarray(prompts), np.asarray(targets))
  return np.asarray(tree[0][:, 0], np.float64)


def not_exact(config: key_token.KeyTokenConfig) -> str | None:
  """Why key_token under `config` has no exact oracle (E-DEC), or None when it has one."""
  if not (config.filler_blind and config.constrained):
    return ("the exact oracle (E-DEC) needs filler_blind and constrained key_token "
            "(decisive positions emit keys only)")
  return None


def _check_exact(config: key_token.KeyTokenConfig) -> None:
  reason = not_exact(config)
  if reason:
    raise ValueError(f"{reason[0].upper()}{reason[1:]}; use mc_credit.")


_jitted_values = nnx.jit(decisive_values, static_argnames="config")


def rb_advantages(q_taken: Array, q_others: Array, p_taken: Array, se_taken: Array,
                  se_others: Array) -> tuple[Array, Array]:
  """Rao-Blackwellised credit: A = (1 - pi)(Q_y - Q_-),
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
