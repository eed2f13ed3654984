"""E-TREE on target_sum: exact token credit for any policy.

The response tree of a prompt holds every prefix of k < n digits; each has m digit
children and, where the policy may stop, an EOS leaf whose reward is known. After n
digits EOS is forced, so a prefix of n digits is a leaf too. Then:

  1. One batched teacher-forced pass over the m^(n-1) paths of n - 1 digits per
     prompt gives pi(. | prefix) at every prefix of length k <= n - 1 (a causal model:
     prefix u's distribution is read off any path through u, here the one whose later
     digits are 0), restricted to the allowed actions as the sampler restricts them, at
     temperature 1.
  2. Back up: V(u) = R(u) for |u| = n, and::

       V(u) = sum_d pi(d | u) V(u d) + pi(EOS | u) R(u)     for |u| < n,

     R(u) the reward of stopping after u (`target_sum.outcome`; pi(EOS | u) = 0 where
     EOS is not allowed).
  3. Look up each sampled response along its path: V(s_t) = V(u_<t) up to its EOS,
     V = R after it, and A_t = V(s_(t+1)) - V(s_t).

A digit that overshoots S gets A_t = -V(s_t) and every later token A = 0, without
special cases: the recursion gives V = 0 below it. `value_tree` and `credit_from_tree`
are traceable; `tree_credit` is the host entry point on sampled rows.

The oracle the training loop reads (`tasks.Task.oracle`): `no_exact_oracle`, `exact_extras`
(E-TREE on sampled rows) and `held_out_success` (V(x) of held-out prompts).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from jaxcredit.rollout import Credit
from jaxcredit.tasks import exact
from jaxcredit.tasks.target_sum import definition as target_sum

MAX_PASSES = 2**17  # teacher-forced paths over all prompts: a guard, never a silent truncation


def passes_per_prompt(config: target_sum.TargetSumConfig) -> int:
  """The teacher-forced paths E-TREE runs for each distinct prompt: m^(n - 1).

  Args:
    config: the task's `TargetSumConfig`.

  Returns:
    the count.
  """
  return config.n_values ** (config.n_digits - 1)


def _prefixes(config: target_sum.TargetSumConfig, k: int) -> np.ndarray:
  """[m^k, k] every prefix of k digit values, in lexicographic (base-m) order."""
  return np.asarray(list(itertools.product(range(config.n_values), repeat=k)),
                    np.int32).reshape(config.n_values**k, k)


def value_tree(model, config: target_sum.TargetSumConfig, prompts, targets) -> list[Array]:
  """The value of every prefix of each prompt. Traceable (jit, vmap over seeds).

  Args:
    model: the policy.
    config: the task's `TargetSumConfig`.
    prompts: ``[n_prompts, 5]`` ids.
    targets: ``[n_prompts]`` the sums S.

  Returns:
    ``[V_0, ..., V_n]``, V_k float32 ``[n_prompts, m^k]``: the value of every prefix of k
    digits (base-m index; V_0 ``[n_prompts, 1]`` is V(x)).
  """
  n, m = config.n_digits, config.n_values
  paths = _prefixes(config, n - 1)  # [N, n - 1]
  prompts, targets = jnp.asarray(prompts, jnp.int32), jnp.asarray(targets)
  count = prompts.shape[0]
  inputs = jnp.concatenate([jnp.repeat(prompts[:, None], len(paths), axis=1),
                            jnp.broadcast_to(target_sum.DIGIT0 + paths, (count, *paths.shape))],
                           axis=2).reshape(count * len(paths), -1)
  width = inputs.shape[1]
  allowed_next = target_sum.allowed_in_rows(config)[1:width + 1]
  logp = exact.masked_log_softmax(model, inputs, allowed_next).reshape(count, len(paths),
                                                                           width, -1)
  actions = np.concatenate([[target_sum.EOS], config.digits])
  start = config.prompt_length - 1  # the column whose output is the distribution of digit 0
  target = targets[:, None]
  values = [target_sum.outcome(_prefixes(config, n)[None], target, config)]  # [count, m^n]
  for k in reversed(range(n)):
    # pi(. | u) for |u| = k: the paths whose digits after u are 0 are every m^(n-1-k)-th.
    probs = jnp.exp(logp[:, ::m ** (n - 1 - k), start + k][..., actions])  # [count, m^k, 1+m]
    stop = target_sum.outcome(_prefixes(config, k)[None], target, config)  # [count, m^k]
    children = values[0].reshape(count, m ** k, m)
    values.insert(0, probs[..., 0] * stop + jnp.sum(probs[..., 1:] * children, axis=-1))
  return values


def credit_from_tree(tree: list[Array], prompt_index, responses, targets,
                     config: target_sum.TargetSumConfig) -> tuple[Array, Array]:
  """Exact values and advantages of responses along their paths in the value tree of their
  prompts. Traceable.

  Args:
    tree: from `value_tree`.
    prompt_index: ``[B]`` each response's row of the tree.
    responses: ``[B, n + 1]`` token ids, each ending with EOS.
    targets: ``[B]`` the sums S.
    config: the task's `TargetSumConfig`.

  Returns:
    ``(values, advantages)``, float32 ``[B, n + 1]`` each.
  """
  n, m = config.n_digits, config.n_values
  responses = jnp.asarray(responses)
  batch = responses.shape[0]
  stopped = stopped_after(responses)
  digits = jnp.clip(responses - target_sum.DIGIT0, 0, m - 1)
  index, along = jnp.zeros(batch, jnp.int32), []
  for k in range(n + 1):
    along.append(tree[k][prompt_index, index])
    if k < n:
      index = index * m + digits[:, k]
  outcome = response_outcome(responses, targets, config)
  columns = jnp.arange(n + 2)[None]
  values = jnp.where(columns <= stopped[:, None],
                     jnp.stack(along + [outcome], axis=1), outcome[:, None])  # [B, n + 2]
  return values[:, :-1], jnp.diff(values, axis=1)


def stopped_after(responses) -> Array:
  """The digits before each response's EOS.

  Args:
    responses: ``[B, n + 1]`` token ids, each with an EOS.

  Returns:
    int ``[B]``.
  """
  return jnp.argmax(jnp.asarray(responses) == target_sum.EOS, axis=1)


def response_outcome(responses, targets, config: target_sum.TargetSumConfig) -> Array:
  """The reward of responses against their targets (`target_sum.reward`, traceable).

  Args:
    responses: ``[B, n + 1]`` token ids, each with an EOS.
    targets: ``[B]`` the sums S.
    config: the task's `TargetSumConfig`.

  Returns:
    float32 ``[B]``.
  """
  n, stopped = config.n_digits, stopped_after(responses)
  values = responses[:, :n] - target_sum.DIGIT0
  before = jnp.arange(n)[None] < stopped[:, None]
  total = jnp.sum(jnp.where(before, values, 0), axis=1)
  hit = total == jnp.asarray(targets)
  if config.exact_len:
    hit &= stopped == n
  if config.no_repeat:
    repeats = (values[:, 1:] == values[:, :-1]) & before[:, 1:]
    hit &= ~jnp.any(repeats, axis=1)
  return hit.astype(jnp.float32)


_jitted_tree = nnx.jit(value_tree, static_argnames="config")
_jitted_credit = jax.jit(credit_from_tree, static_argnames="config")


def exact_success(model, config: target_sum.TargetSumConfig, prompts, targets) -> np.ndarray:
  """``V(x) = P(R = 1 | x)`` of each prompt at temperature 1.

  Args:
    model: the policy.
    config: the task's `TargetSumConfig`.
    prompts: ``[n_prompts, 5]`` ids.
    targets: ``[n_prompts]`` the sums S.

  Returns:
    float64 ``[n_prompts]``.
  """
  return np.asarray(_jitted_tree(model, config, np.asarray(prompts), np.asarray(targets))[0][:, 0],
                    np.float64)


def tree_credit(model, config: target_sum.TargetSumConfig, tokens: np.ndarray, mask: np.ndarray,
                targets: np.ndarray, *, max_passes: int = MAX_PASSES) -> Credit:
  """Exact credit (E-TREE, module docstring) of sampled responses at temperature 1.

  Args:
    model: the policy.
    config: the task's `TargetSumConfig`.
    tokens: ``[B, 5 + n + 1]`` rows (the prompt, then the response ending with EOS).
    mask: ``[B, 5 + n + 1]`` bool, the actions.
    targets: ``[B]`` the sums S.
    max_passes: the most teacher-forced paths allowed.

  Returns:
    the `Credit`; values V(s_t) and advantages are 0 off `mask`.

  Raises:
    ValueError: when the tree needs more than `max_passes` paths (the count is given), or a
      response holds a token its position does not allow or no EOS.
  """
  tokens, mask, targets = np.asarray(tokens), np.asarray(mask, bool), np.asarray(targets)
  prompt_len, length = config.prompt_length, config.length
  if tokens.shape[1:] != (prompt_len + length,) or targets.shape != tokens.shape[:1]:
    raise ValueError(f"Expected rows [B, {prompt_len} + {length}] and targets [B], got "
                     f"{tokens.shape} and {targets.shape}.")
  response, in_response = tokens[:, prompt_len:], mask[:, prompt_len:]
  allowed = target_sum.allowed(config)
  fits = np.take_along_axis(allowed[None], response[..., None], axis=2)[..., 0]
  if not np.all(fits | ~in_response) or not np.all((response == target_sum.EOS).any(axis=1)):
    raise ValueError("A response holds a token the task does not allow at its position, or "
                     "no EOS.")
  return exact.tree_credit_rows(
      tokens, mask, prompt_len, per_prompt=passes_per_prompt(config),
      path_length=prompt_len + config.n_digits - 1, max_passes=max_passes,
      advice="fewer digits (n_digits) or values (n_values), or use mc_credit",
      credit_of=lambda prompts, first, inverse: _jitted_credit(
          _jitted_tree(model, config, prompts, targets[first]), inverse, response, targets,
          config))


def no_exact_oracle(config: target_sum.TargetSumConfig) -> None:
  """Why a training run on this task under `config` has no exact oracle.

  Args:
    config: the task's `TargetSumConfig`.

  Returns:
    None: this task always has its exact oracle.
  """
  del config


def exact_extras(model, config: target_sum.TargetSumConfig, rollout,
                 examples) -> tuple[dict, dict]:
  """The exact credit of a training rollout, as rollout extras: E-TREE (`tree_credit`).

  Args:
    model: the policy that sampled the rollout.
    config: the task's `TargetSumConfig`.
    rollout: the sampled `Rollout`.
    examples: the task example of each row.

  Returns:
    ``({"oracle_advantages", "oracle_values"} [B, L], {"oracle_passes"})``.
  """
  targets = np.asarray([int(e["target"]) for e in examples])
  return exact.as_extras(tree_credit(model, config, np.asarray(rollout.tokens),
                                     np.asarray(rollout.mask), targets))


def held_out_success(model, config: target_sum.TargetSumConfig, examples) -> np.ndarray:
  """The exact success probability V(x) of each held-out example (`exact_success`).

  Args:
    model: the policy.
    config: the task's `TargetSumConfig`.
    examples: the held-out examples.

  Returns:
    float64 ``[n]``.
  """
  return exact_success(model, config, np.stack([e["prompt"] for e in examples]),
                       np.stack([e["target"] for e in examples]))
