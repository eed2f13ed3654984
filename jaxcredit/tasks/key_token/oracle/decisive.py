"""Exact token credit on filler-blind key_token under any policy, at temperature 1: E-DEC.

E-DEC (filler-blind key_token): the policy cannot see filler, so V(s_t) depends only on the
decisive keys emitted so far; `decisive_values` enumerates the |C|^k prefixes of decisive
keys of each prompt (W_k [n, |C|^k]), `credit_from_values` reads each response's values
along its keys.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from jaxcredit.rollout import Credit
from jaxcredit.tasks import exact, procedural
from jaxcredit.tasks.key_token import definition as key_token


def _decisive_conditionals(model, config: key_token.KeyTokenConfig, prompts: Array,
                           keys: Array) -> Array:
  """pi(. | x_i, keys[i, m, :k]) over C at each decisive position k of filler-blind
  key_token, ``[n, M, K, |C|]``, from one teacher-forced pass over the ``n * M`` responses
  whose decisive tokens are ``keys`` ``[n, M, K]`` (key indices) and whose filler is FILL."""
  n, m = keys.shape[:2]
  prompt_len, positions = config.prompt_length, config.decisive_positions
  response = jnp.full((n, m, config.length), key_token.FILL, jnp.int32)
  response = response.at[..., positions].set(key_token.KEY0 + keys.astype(jnp.int32))
  rows = jnp.concatenate([jnp.repeat(jnp.asarray(prompts, jnp.int32), m, axis=0),
                          response.reshape(n * m, config.length)], axis=1)
  allowed = key_token.allowed_in_rows(config)
  logp = exact.masked_log_softmax(model, rows,
                                  np.concatenate([allowed[1:], np.ones_like(allowed[:1])]))
  return jnp.exp(logp[:, prompt_len + positions - 1][..., config.keys]).reshape(
      n, m, config.n_decisive, config.n_keys)


def decisive_distributions(model, config: key_token.KeyTokenConfig, prompts: Array,
                           targets: Array) -> Array:
  """The policy's distribution over the keys at each decisive position of filler-blind
  key_token, given the right keys before it, at temperature 1. Traceable.

  ``D[i, k, c] = pi(C[c] | x_i, y_(p_1) .. y_(p_(k-1)) = the targets)``: under rule `all`,
  ``prod_k D[i, k, target_k] = V(x_i)``; its entropy over c says whether a prompt's keys
  are unlearnt (near ln |C|) or settled (near 0) on the right key or on a wrong one.

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig`.
    prompts: ``[n, K + 2]`` prompt ids.
    targets: ``[n, K]`` the key ids each must copy.

  Returns:
    float32 ``[n, K, |C|]``.

  Examples:
    >>> from flax import nnx
    >>> from jaxcredit import models
    >>> from jaxcredit.tasks.key_token import definition, oracle, traceable
    >>> config = definition.KeyTokenConfig(length=6, n_keys=3, n_decisive=2,
    ...                                    filler_blind=True)
    >>> model = models.Transformer(models.preset("tiny", vocab_size=definition.VOCAB_SIZE),
    ...                            rngs=nnx.Rngs(0))
    >>> prompts, targets = traceable.prompts_of([[0, 2]], config)
    >>> oracle.decisive_distributions(model, config, prompts, targets).shape
    (1, 2, 3)
  """
  _check_exact(config)
  keys = jnp.asarray(targets, jnp.int32)[:, None] - key_token.KEY0
  return _decisive_conditionals(model, config, prompts, keys)[:, 0]


def key_distribution(model, config: key_token.KeyTokenConfig, prompts: Array) -> Array:
  """The policy's joint distribution over the decisive keys of filler-blind key_token, at
  temperature 1. Traceable.

  ``P[i, u] = prod_k pi(C[u_k] | x_i, C[u_1] .. C[u_(k-1)])``, u a lexicographic index over
  ``C^K`` (key index = id - KEY0), from one teacher-forced pass over ``|C|^K`` rows per
  prompt: what the reward of any rule reads.

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig`.
    prompts: ``[n, K + 2]`` prompt ids.

  Returns:
    float32 ``[n, |C|^K]``, each row summing to 1.

  Examples:
    >>> from flax import nnx
    >>> from jaxcredit import models
    >>> from jaxcredit.tasks.key_token import definition, oracle, traceable
    >>> config = definition.KeyTokenConfig(length=6, n_keys=3, n_decisive=2,
    ...                                    filler_blind=True)
    >>> model = models.Transformer(models.preset("tiny", vocab_size=definition.VOCAB_SIZE),
    ...                            rngs=nnx.Rngs(0))
    >>> prompts, _ = traceable.prompts_of([[0, 2]], config)
    >>> oracle.key_distribution(model, config, prompts).shape
    (1, 9)
  """
  _check_exact(config)
  keys = procedural.key_tuples(config.n_keys, config.n_decisive)  # [M, K]
  n = prompts.shape[0]
  probs = _decisive_conditionals(model, config, prompts,
                                 jnp.broadcast_to(jnp.asarray(keys), (n, *keys.shape)))
  picked = jnp.take_along_axis(probs, jnp.asarray(keys)[None, :, :, None], axis=-1)[..., 0]
  return jnp.prod(picked, axis=-1)


def decisive_values(model, config: key_token.KeyTokenConfig, prompts: Array,
                    targets: Array) -> list[Array]:
  """The exact value tree of filler-blind key_token (E-DEC) at temperature 1. Traceable (jit,
  vmap over seeds).

  The policy's conditional at decisive position p_k depends only on the prompt and the
  decisive tokens before it (filler is hidden), so one teacher-forced pass over
  ``|C|^(K-1)`` rows per prompt gives every W_k.

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig`.
    prompts: ``[n, K + 2]`` prompt ids.
    targets: ``[n, K]`` the key ids each must copy.

  Returns:
    ``[W_0, ..., W_K]``, W_k float32 ``[n, |C|^k]``: ``W_k[i, u] = E[R | x_i, the first k
    decisive tokens are u]``, u a lexicographic index over C (key index = id - KEY0).
  """
  _check_exact(config)
  n_keys, n_decisive = config.n_keys, config.n_decisive
  prefixes = procedural.key_tuples(n_keys, n_decisive - 1)  # [M, K - 1], M = |C|^(K-1)
  # Each prefix's response, its last decisive token C[0] (it conditions nothing): [M, K].
  keys = np.concatenate([prefixes, np.zeros((len(prefixes), 1), np.int32)], axis=1)
  n = prompts.shape[0]
  # [n, M, K, |C|]: pi(. | x, prefix) at each decisive position.
  probs = _decisive_conditionals(model, config, prompts,
                                 jnp.broadcast_to(jnp.asarray(keys), (n, *keys.shape)))
  leaves = procedural.key_tuples(n_keys, n_decisive)
  tree = [key_token.rule_reward(key_token.KEY0 + jnp.asarray(leaves)[None],
                                jnp.asarray(targets)[:, None], config)]
  for k in reversed(range(n_decisive)):
    # The row whose first k decisive tokens are u (index j) and whose others are C[0]: j C^(K-1-k).
    conditional = probs[:, np.arange(n_keys**k) * n_keys**(n_decisive - 1 - k), k]
    tree.insert(0, jnp.sum(conditional * tree[0].reshape(n, n_keys**k, n_keys), axis=-1))
  return tree


def credit_from_values(tree: Sequence[Array], decided: Array,
                       config: key_token.KeyTokenConfig) -> tuple[Array, Array]:
  """Exact values and advantages read along each row's decisive tokens from its value tree.
  Traceable::

    V(s_t) = W_k(t)(d_<k(t)),  k(t) = #{p < t};   A = W_(k+1)(d_<=k) - W_k(d_<k) at p_k, 0 on filler

  Args:
    tree: ``[W_0, ..., W_K]``, W_k ``[B, |C|^k]`` (`decisive_values` gathered per row).
    decided: ``[B, K]`` the rows' decisive token ids.
    config: the task's `KeyTokenConfig`.

  Returns:
    ``(values, advantages)``, float32 ``[B, T]`` each, over the response positions.
  """
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
  """Exact credit on filler-blind key_token (E-DEC), temperature 1: the value tree of each
  distinct prompt (`decisive_values`, one batched pass) read along each row's decisive
  tokens (`credit_from_values`).

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig`.
    tokens: ``[B, L]`` rows (K + 2 prompt ids, then the T response ids).
    mask: ``[B, L]`` bool, the actions.
    targets: ``[B, K]`` the keys each row must copy.

  Returns:
    the `Credit`; values and advantages are 0 off `mask`.

  Raises:
    ValueError: when the options have no E-DEC oracle.
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
      for x in _jitted_credit(tree, jnp.asarray(response[:, config.decisive_positions]),
                              config=config))
  values, advantages = np.where(mask, values, 0.0), np.where(mask, advantages, 0.0)
  passes = len(prompts) * config.n_keys**(config.n_decisive - 1)
  return Credit(
      advantages=jnp.asarray(advantages, jnp.float32), values=jnp.asarray(values, jnp.float32),
      adv_stderr=jnp.zeros(tokens.shape, jnp.float32), evaluated=jnp.asarray(mask),
      cost={"passes": passes, "tf_tokens": passes * tokens.shape[1], "rollouts": 0, "gen_tokens": 0,
            "prefill_tokens": 0},
  )


def exact_success(model, config: key_token.KeyTokenConfig, prompts: np.ndarray,
                  targets: np.ndarray) -> np.ndarray:
  """The exact expected reward ``V(x) = E_pi[R | x]`` of each prompt at temperature 1
  (filler-blind key_token): the root of its value tree (`decisive_values`). Its mean over
  held-out prompts is the policy's expected success J(pi), free of the sampling noise of a
  measured accuracy.

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig`.
    prompts: ``[n, K + 2]`` prompt ids.
    targets: ``[n, K]`` the keys each must copy.

  Returns:
    float64 ``[n]``.
  """
  tree = _jitted_values(model, config, np.asarray(prompts), np.asarray(targets))
  return np.asarray(tree[0][:, 0], np.float64)


def not_exact(config: key_token.KeyTokenConfig) -> str | None:
  """Why key_token under `config` has no exact oracle (E-DEC).

  Args:
    config: the task's `KeyTokenConfig`.

  Returns:
    the reason, or None when it has one.
  """
  if not (config.filler_blind and config.constrained):
    return ("the exact oracle (E-DEC) needs filler_blind and constrained key_token "
            "(decisive positions emit keys only)")
  return None


def _check_exact(config: key_token.KeyTokenConfig) -> None:
  reason = not_exact(config)
  if reason:
    raise ValueError(f"{reason[0].upper()}{reason[1:]}; use mc_credit.")


_jitted_values = nnx.jit(decisive_values, static_argnames="config")
_jitted_credit = jax.jit(credit_from_values, static_argnames="config")
