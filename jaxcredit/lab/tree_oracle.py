"""E-TREE: exact token credit on key_token for any policy, filler visible or not (LAB.md 1.4).

With filler visible, a later decisive conditional can depend on an earlier filler token, so
filler carries real credit (LAB.md Proposition 1) and E-DEC (`oracle.decisive_credit`) does
not apply. E-TREE enumerates the response tree up to the last decisive position p_K:

  1. Expand. Every prefix of the first p_K response positions, one child per allowed action;
     under rule `all` a wrong key at p_1..p_(K-1) makes R = 0 determined, so only the
     target key is expanded there (pruning (ii)). Filler after p_K cannot change R: the tree
     stops at p_K (pruning (i)). Passes per prompt: prod over positions t < p_K of the
     expanded actions, e.g. |F|^(p_K - K + 1) under `all`.
  2. One batched teacher-forced pass per path (length K + 2 + p_K + 1, in chunks of
     `max_rows` rows) gives pi(. | prefix) at every position of the path, restricted to the
     allowed actions exactly as the sampler restricts them, at temperature 1.
  3. Back up in float64: V(prefix of length p_K) = sum_c pi(c | prefix) R(y_P with c), then
     V(prefix_<t) = sum_a pi(a | prefix_<t) V(prefix_<t + a) down to the prompt (a pruned
     child has V = 0).
  4. Look up each sampled response: V(s_t) along its path (0 after a wrong key under `all`),
     V = R after p_K, and A_t = V(s_(t+1)) - V(s_t) (0 after p_K).

Values are those of the rule's reward (a `noise` flip is not modelled, as in E-DEC).
"""

import itertools

import jax.numpy as jnp
import numpy as np

from jaxcredit.lab import oracle
from jaxcredit.tasks import key_token
from jaxcredit.train.monte_carlo import Credit

MAX_PASSES = 2**17  # teacher-forced paths over all prompts: a guard, never a silent truncation


def _expanded(config: key_token.KeyTokenConfig) -> tuple[list[np.ndarray], list[bool]]:
  """The allowed action ids at each response position t <= p_K, and whether t is a decisive
  position before p_K pinned to its target key (rule `all`: the other keys give R = 0)."""
  allowed = key_token.allowed(config)
  positions = config.decisive_positions
  options = [np.flatnonzero(allowed[t]) for t in range(positions[-1] + 1)]
  pinned = [config.rule == "all" and t in positions[:-1] for t in range(positions[-1])]
  return options, pinned


def passes_per_prompt(config: key_token.KeyTokenConfig) -> int:
  """The teacher-forced paths E-TREE runs for each distinct prompt."""
  options, pinned = _expanded(config)
  return int(np.prod([1 if pin else len(o) for o, pin in zip(options, pinned)], dtype=np.int64))


def _paths(config: key_token.KeyTokenConfig, prompts: np.ndarray, targets: np.ndarray):
  """[n, N, K + 2 + p_K + 1] model inputs of every path of every prompt, and its [n, N, T]
  responses (positions after p_K: any allowed token; a causal pass never reads them)."""
  options, pinned = _expanded(config)
  last, prompt_len = config.decisive_positions[-1], config.prompt_length
  radices = [1 if pin else len(o) for o, pin in zip(options, pinned)]
  combinations = list(itertools.product(*map(range, radices)))  # the paths' action indices
  digits = np.asarray(combinations, np.int64).reshape(len(combinations), last)
  n = len(prompts)
  responses = np.tile(np.asarray([o[0] for o in options] + [config.fillers[0]] * (
      config.length - last - 1), np.int32), (n, len(digits), 1))  # [n, N, T]
  decisive_index = {int(p): k for k, p in enumerate(config.decisive_positions)}
  for t in range(last):
    responses[:, :, t] = (targets[:, decisive_index[t], None] if pinned[t]
                          else options[t][digits[:, t]][None])
  inputs = np.concatenate([np.repeat(prompts[:, None], len(digits), axis=1),
                           key_token.observe(responses, config)], axis=2)
  return inputs[:, :, :prompt_len + last + 1], responses


def _conditionals(model, config, inputs: np.ndarray, max_rows: int) -> list[np.ndarray]:
  """pi(a | path prefix) [n, N, |options_t|] float64 at each response position t <= p_K."""
  options, _ = _expanded(config)
  n, paths, width = inputs.shape
  flat = inputs.reshape(n * paths, width)
  allowed = key_token.allowed_in_rows(config)[:width]
  chunk = min(max_rows, len(flat))
  rows = np.concatenate([flat, np.repeat(flat[-1:], -len(flat) % chunk, axis=0)])
  logp = np.concatenate([oracle._teacher_forced_logprobs(model, rows[i:i + chunk], allowed)
                         for i in range(0, len(rows), chunk)])[:len(flat)]
  start = config.prompt_length - 1  # column whose output is the distribution of position 0
  return [np.exp(logp[:, start + t, o]).reshape(n, paths, len(o)) for t, o in enumerate(options)]


def value_tree(model, config: key_token.KeyTokenConfig, prompts: np.ndarray,
               targets: np.ndarray, *, max_rows: int = 4096) -> list[np.ndarray]:
  """[V_0, ..., V_(p_K)], V_t [n, r_0, ..., r_(t-1)] float64: the value of every expanded
  prefix of length t of each prompt (r_s: the expanded actions at position s). prompts
  [n, K + 2], targets [n, K] key ids."""
  options, pinned = _expanded(config)
  last = config.decisive_positions[-1]
  inputs, responses = _paths(config, prompts, targets)
  probs = _conditionals(model, config, inputs, max_rows)
  n, radices = len(prompts), [1 if pin else len(o) for o, pin in zip(options, pinned)]
  # Leaves: the last key c completes y_P; V(prefix of length p_K) = sum_c pi(c) R.
  picked = np.repeat(responses[:, :, config.decisive_positions][:, :, None], len(options[last]),
                     axis=2)
  picked[..., -1] = options[last]
  rewards = key_token.rule_reward(picked, targets[:, None, None], config).astype(np.float64)
  values = [np.sum(probs[last] * rewards, axis=-1).reshape(n, *radices)]
  for t in reversed(range(last)):
    # pi(. | prefix of length t) from the path whose later digits are 0 (causal model).
    first_path = probs[t].reshape(n, *radices, -1)[(slice(None),) * (t + 1) + (0,) * (last - t)]
    child = values[0]
    if pinned[t]:
      key = np.searchsorted(options[t], targets[:, list(config.decisive_positions).index(t)])
      at_key = np.take_along_axis(first_path, key.reshape(n, *[1] * (t + 1)), axis=-1)[..., 0]
      values.insert(0, at_key * child[..., 0])
    else:
      values.insert(0, np.sum(first_path * child, axis=-1))
  return values


def tree_credit(model, config: key_token.KeyTokenConfig, tokens: np.ndarray, mask: np.ndarray,
                targets: np.ndarray, *, max_passes: int = MAX_PASSES,
                max_rows: int = 4096) -> Credit:
  """Exact credit (E-TREE, module docstring) of B sampled responses under `model` at
  temperature 1, on constrained or unconstrained key_token with filler visible or hidden.

  tokens, mask: [B, L] rows (K + 2 prompt ids, then the T response ids); targets: [B, K]
  the keys each row must copy. Values V(s_t) and advantages are 0 off `mask`. Raises
  ValueError when the tree needs more than `max_passes` paths (the count is given)."""
  tokens, mask, targets = np.asarray(tokens), np.asarray(mask, bool), np.asarray(targets)
  prompt_len, length = config.prompt_length, config.length
  if tokens.shape[1:] != (prompt_len + length,) or targets.shape != (len(tokens),
                                                                     config.n_decisive):
    raise ValueError(f"Expected rows [B, {prompt_len} + {length}] and targets [B, "
                     f"{config.n_decisive}], got {tokens.shape} and {targets.shape}.")
  prompts, first, inverse = np.unique(tokens[:, :prompt_len], axis=0, return_index=True,
                                      return_inverse=True)
  passes = len(prompts) * passes_per_prompt(config)
  if passes > max_passes:
    raise ValueError(f"E-TREE needs {passes:,} teacher-forced paths ({len(prompts)} prompts x "
                     f"{passes_per_prompt(config):,}), over max_passes = {max_passes:,}: "
                     "place the decisive positions earlier, or use mc_credit.")
  values_by_depth = value_tree(model, config, prompts, targets[first], max_rows=max_rows)
  options, pinned = _expanded(config)
  last, inverse = config.decisive_positions[-1], inverse.reshape(-1)
  response = tokens[:, prompt_len:]
  digits, alive = np.zeros((len(tokens), last), np.int64), np.ones(len(tokens), bool)
  values = np.zeros((len(tokens), length + 1))
  for t in range(last + 1):
    values[:, t] = np.where(alive, values_by_depth[t][(inverse, *digits[:, :t].T)], 0.0)
    if t == last:
      break
    found = response[:, t, None] == options[t][None]
    if not found.any(axis=1).all():
      raise ValueError(f"Response position {t} holds a token the task does not allow there.")
    if pinned[t]:
      alive &= response[:, t] == targets[:, list(config.decisive_positions).index(t)]
    else:
      digits[:, t] = found.argmax(axis=1)
  values[:, last + 1:] = key_token.rule_reward(response[:, config.decisive_positions], targets,
                                               config)[:, None]
  advantages = np.diff(values, axis=1)
  rows = lambda x: jnp.asarray(np.where(
      mask, np.concatenate([np.zeros((len(tokens), prompt_len)), x], 1), 0.0), jnp.float32)
  return Credit(advantages=rows(advantages), values=rows(values[:, :length]),
                adv_stderr=jnp.zeros(tokens.shape, jnp.float32), evaluated=jnp.asarray(mask),
                cost={"passes": passes, "tf_tokens": passes * (prompt_len + last + 1),
                      "rollouts": 0, "gen_tokens": 0, "prefill_tokens": 0})
