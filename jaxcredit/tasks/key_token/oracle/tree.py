"""Exact token credit on key_token, filler visible or not, at temperature 1: E-TREE.

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
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from jaxcredit.rollout import Credit
from jaxcredit.tasks import exact
from jaxcredit.tasks.key_token import definition as key_token


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
_jitted_credit = jax.jit(credit_from_tree, static_argnames="config")


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
      credit_of=lambda prompts, first, inverse: _jitted_credit(
          _jitted_tree(model, config, prompts, targets[first]), inverse, response, targets,
          config))
