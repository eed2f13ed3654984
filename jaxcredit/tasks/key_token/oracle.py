"""Exact token credit on key_token under any policy, at temperature 1.

E-DEC (filler-blind key_token): the policy cannot see filler, so V(s_t) depends only on the
decisive keys emitted so far; `decisive_values` enumerates the |C|^k prefixes of decisive
keys of each prompt (W_k [n, |C|^k]), `credit_from_values` reads each response's values
along its keys.

E-TREE (filler visible or not): with filler visible, a later decisive conditional can
depend on an earlier filler token, so filler carries real credit and E-DEC does not apply.
E-TREE enumerates the response tree up to the last decisive position p_K:

  1. Expand. Every prefix of the first p_K response positions, one child per allowed action;
     under rule `all` a wrong key at p_1..p_(K-1) makes R = 0 determined, so only the
     target key is expanded there (pruning (ii)). Filler after p_K cannot change R: the tree
     stops at p_K (pruning (i)). Passes per prompt: prod over positions t < p_K of the
     expanded actions, e.g. |F|^(p_K - K + 1) under `all`.
  2. One batched teacher-forced pass over the paths (length K + 2 + p_K + 1) gives
     pi(. | prefix) at every position of every path, restricted to the allowed actions
     exactly as the sampler restricts them, at temperature 1.
  3. Back up: V(prefix of length p_K) = sum_c pi(c | prefix) R(y_P with c), then
     V(prefix_<t) = sum_a pi(a | prefix_<t) V(prefix_<t + a) down to the prompt (a pruned
     child has V = 0).
  4. Look up each sampled response: V(s_t) along its path (0 after a wrong key under `all`),
     V = R after p_K, and A_t = V(s_(t+1)) - V(s_t) (0 after p_K).

Values are those of the rule's reward (a `noise` flip is not modelled, as in E-DEC).
`value_tree` and `credit_from_tree` are traceable (the lab's batched runs call them inside
their jit); `tree_credit` is the host entry point on sampled rows.

The oracle the training loop and the credit lab read (`tasks.Task.oracle`): `no_exact_oracle`,
`exact_extras` (E-DEC on sampled rows) and `held_out_success` (V(x) of held-out prompts).
"""

import itertools
from collections.abc import Sequence

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


MAX_PASSES = 2**17  # teacher-forced paths over all prompts: a guard, never a silent truncation


def _expanded(config: key_token.KeyTokenConfig):
  """(options, pinned, radices): the allowed action ids at each response position t <= p_K;
  whether t < p_K is a decisive position pinned to its target key (rule `all`: the other
  keys give R = 0); and the actions expanded at each t < p_K (1 where pinned)."""
  allowed = key_token.allowed(config)
  positions = config.decisive_positions
  options = [np.flatnonzero(allowed[t]) for t in range(positions[-1] + 1)]
  pinned = [config.rule == "all" and t in positions[:-1] for t in range(positions[-1])]
  return options, pinned, [1 if pin else len(o) for o, pin in zip(options, pinned)]


def passes_per_prompt(config: key_token.KeyTokenConfig) -> int:
  """The teacher-forced paths E-TREE runs for each distinct prompt.

  Args:
    config: the task's `KeyTokenConfig`.

  Returns:
    the count.
  """
  return int(np.prod(_expanded(config)[2], dtype=np.int64))


def _paths(config: key_token.KeyTokenConfig, prompts, targets):
  """[n, N, K + 2 + p_K + 1] model inputs of every path of every prompt, and its [n, N, T]
  responses (positions after p_K: any allowed token; a causal pass never reads them).
  Traceable in prompts [n, K + 2] and targets [n, K]."""
  options, pinned, radices = _expanded(config)
  last, prompt_len = config.decisive_positions[-1], config.prompt_length
  combinations = list(itertools.product(*map(range, radices)))  # the paths' action indices
  digits = np.asarray(combinations, np.int64).reshape(len(combinations), last)
  fixed = np.tile(np.asarray([o[0] for o in options] + [config.fillers[0]] * (
      config.length - last - 1), np.int32), (len(digits), 1))  # [N, T]
  for t in range(last):
    if not pinned[t]:
      fixed[:, t] = options[t][digits[:, t]]
  targets = jnp.asarray(targets, jnp.int32)
  n = targets.shape[0]
  at_pin = jnp.zeros((n, config.length), jnp.int32)
  for k, position in enumerate(config.decisive_positions[:-1]):
    if pinned[position]:
      at_pin = at_pin.at[:, position].set(targets[:, k])
  is_pin = np.asarray(pinned + [False] * (config.length - last))
  responses = jnp.where(is_pin, at_pin[:, None], fixed[None])  # [n, N, T]
  seen = responses if not config.filler_blind else jnp.where(_hidden(config), key_token.FILL,
                                                             responses)
  inputs = jnp.concatenate([jnp.repeat(jnp.asarray(prompts, jnp.int32)[:, None], len(digits),
                                       axis=1), seen], axis=2)
  return inputs[:, :, :prompt_len + last + 1], responses


def _hidden(config: key_token.KeyTokenConfig) -> np.ndarray:
  """[T] bool: the response positions later inputs do not see (filler, when filler-blind)."""
  hidden = np.full(config.length, config.filler_blind)
  hidden[config.decisive_positions] = False
  return hidden


def value_tree(model, config: key_token.KeyTokenConfig, prompts, targets) -> list[Array]:
  """The value of every expanded prefix of each prompt (E-TREE). Traceable (jit, vmap over
  seeds).

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig`.
    prompts: ``[n, K + 2]`` prompt ids.
    targets: ``[n, K]`` key ids.

  Returns:
    ``[V_0, ..., V_(p_K)]``, V_t float32 ``[n, r_0, ..., r_(t-1)]`` (r_s: the expanded
    actions at position s; V_0 ``[n]`` is V(x)).
  """
  options, pinned, radices = _expanded(config)
  last = config.decisive_positions[-1]
  inputs, responses = _paths(config, prompts, targets)
  n, paths, width = inputs.shape
  allowed = key_token.allowed_in_rows(config)[:width]
  logp = exact.masked_log_softmax(model, inputs.reshape(n * paths, width),
                                   np.concatenate([allowed[1:], allowed[-1:]]))
  start = config.prompt_length - 1  # the column whose output is the distribution of position 0
  probs = [jnp.exp(logp[:, start + t, o]).reshape(n, paths, len(o)) for t, o in enumerate(options)]
  targets = jnp.asarray(targets, jnp.int32)
  # Leaves: the last key c completes y_P; V(prefix of length p_K) = sum_c pi(c) R.
  picked = jnp.concatenate([jnp.broadcast_to(
      responses[:, :, None, config.decisive_positions[:-1]], (n, paths, len(options[last]),
                                                              config.n_decisive - 1)),
      jnp.broadcast_to(options[last][:, None], (n, paths, len(options[last]), 1))], axis=-1)
  rewards = key_token.rule_reward(picked, targets[:, None, None], config)
  values = [jnp.sum(probs[last] * rewards, axis=-1).reshape(n, *radices)]
  for t in reversed(range(last)):
    # pi(. | prefix of length t) from the path whose later digits are 0 (causal model).
    first_path = probs[t].reshape(n, *radices, -1)[(slice(None),) * (t + 1) + (0,) * (last - t)]
    child = values[0]
    if pinned[t]:
      key = jnp.searchsorted(options[t], targets[:, list(config.decisive_positions).index(t)])
      at_key = jnp.take_along_axis(first_path, key.reshape(n, *[1] * (t + 1)), axis=-1)[..., 0]
      values.insert(0, at_key * child[..., 0])
    else:
      values.insert(0, jnp.sum(first_path * child, axis=-1))
  return values


def credit_from_tree(tree: list[Array], prompt_index, responses, targets,
                     config: key_token.KeyTokenConfig) -> tuple[Array, Array]:
  """Exact values and advantages of responses along their paths in the value tree of their
  prompts. Traceable.

  V(s_t) along the path (0 after a wrong key under `all`), V = R after p_K,
  ``A_t = V(s_(t+1)) - V(s_t)``. Tokens the task does not allow at a position read as its
  first action.

  Args:
    tree: from `value_tree`.
    prompt_index: ``[B]`` each response's row of the tree.
    responses: ``[B, T]`` int.
    targets: ``[B, K]`` key ids.
    config: the task's `KeyTokenConfig`.

  Returns:
    ``(values, advantages)``, float32 ``[B, T]`` each.
  """
  options, pinned, _ = _expanded(config)
  last = config.decisive_positions[-1]
  responses, targets = jnp.asarray(responses), jnp.asarray(targets)
  batch = responses.shape[0]
  digits, alive, values = [], jnp.ones(batch, bool), []
  for t in range(last + 1):
    values.append(jnp.where(alive, tree[t][(prompt_index, *digits)], 0.0))
    if t < last and pinned[t]:
      alive &= responses[:, t] == targets[:, list(config.decisive_positions).index(t)]
      digits.append(jnp.zeros(batch, jnp.int32))
    elif t < last:
      digits.append(jnp.argmax(responses[:, t, None] == options[t], axis=1))
  outcome = key_token.rule_reward(responses[:, config.decisive_positions], targets, config)
  values = jnp.stack(values + [outcome] * (config.length - last), axis=1)  # [B, T + 1]
  return values[:, :-1], jnp.diff(values, axis=1)


_jitted_tree = nnx.jit(value_tree, static_argnames="config")


def tree_credit(model, config: key_token.KeyTokenConfig, tokens: np.ndarray, mask: np.ndarray,
                targets: np.ndarray, *, max_passes: int = MAX_PASSES) -> Credit:
  """Exact credit (E-TREE, module docstring) of sampled responses at temperature 1, on
  constrained or unconstrained key_token with filler visible or hidden.

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig`.
    tokens: ``[B, L]`` rows (K + 2 prompt ids, then the T response ids).
    mask: ``[B, L]`` bool, the actions.
    targets: ``[B, K]`` the keys each row must copy.
    max_passes: the most teacher-forced paths allowed.

  Returns:
    the `Credit`; values V(s_t) and advantages are 0 off `mask`.

  Raises:
    ValueError: when the tree needs more than `max_passes` paths (the count is given), or a
      response holds a token its position does not allow.
  """
  tokens, mask, targets = np.asarray(tokens), np.asarray(mask, bool), np.asarray(targets)
  prompt_len, length = config.prompt_length, config.length
  if tokens.shape[1:] != (prompt_len + length,) or targets.shape != (len(tokens),
                                                                     config.n_decisive):
    raise ValueError(f"Expected rows [B, {prompt_len} + {length}] and targets [B, "
                     f"{config.n_decisive}], got {tokens.shape} and {targets.shape}.")
  response = tokens[:, prompt_len:]
  allowed = key_token.allowed(config)
  if not np.all(np.take_along_axis(allowed[None], response[..., None], axis=2)[..., 0]):
    raise ValueError("A response holds a token the task does not allow at its position.")
  return exact.tree_credit_rows(
      tokens, mask, prompt_len, per_prompt=passes_per_prompt(config),
      path_length=prompt_len + int(config.decisive_positions[-1]) + 1, max_passes=max_passes,
      advice="place the decisive positions earlier, or use mc_credit",
      credit_of=lambda prompts, first, inverse: credit_from_tree(
          _jitted_tree(model, config, prompts, targets[first]), inverse, response, targets,
          config))


def no_exact_oracle(config: key_token.KeyTokenConfig) -> str | None:
  """Why a training run on this task under `config` has no exact oracle.

  Args:
    config: the task's `KeyTokenConfig`.

  Returns:
    the reason and what to do instead, or None when it has one.
  """
  reason = not_exact(config)
  return (f"{reason}: set task.options filler_blind=True and constrained=True, or use vineppo "
          "(Monte Carlo).") if reason else None


def exact_extras(model, config: key_token.KeyTokenConfig, rollout, examples) -> tuple[dict, dict]:
  """The exact credit of a training rollout, as rollout extras: E-DEC (`decisive_credit`).

  Args:
    model: the policy that sampled the rollout.
    config: the task's `KeyTokenConfig`.
    rollout: the sampled `Rollout`.
    examples: the task example of each row.

  Returns:
    ``({"oracle_advantages", "oracle_values"} [B, L], {"oracle_passes"})``.

  Raises:
    ValueError: when the options have no exact oracle.
  """
  targets = np.stack([np.asarray(e["targets"]) for e in examples])
  return exact.as_extras(decisive_credit(model, config, np.asarray(rollout.tokens),
                                         np.asarray(rollout.mask), targets))


def held_out_success(model, config: key_token.KeyTokenConfig, examples) -> np.ndarray:
  """The exact success probability V(x) of each held-out example (`exact_success`).

  Args:
    model: the policy.
    config: the task's `KeyTokenConfig`.
    examples: the held-out examples.

  Returns:
    float64 ``[n]``.
  """
  return exact_success(model, config, np.stack([e["prompt"] for e in examples]),
                       np.stack([e["targets"] for e in examples]))
