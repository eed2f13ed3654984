"""Exact turn-level values and credit on `key_turns`, by enumerating the tree of histories.

With the outcome rule "all", a history whose decisive turns were all right so
far has value

  V(h_k) = sum_a pi(a | h_k) E_{key_(k+1)} V(h_k, a, obs_(k+1))    (k not decisive)
  V(h_k) = pi(key_k | h_k) E_{key_(k+1)} V(h_k, key_k, obs_(k+1))  (k decisive)
  V(h_K) = 1,

where the expectation is over the next key while it is still hidden (uniform
over the n_keys keys when turn k + 1 is decisive, nothing to average
otherwise), and any other history has value 0. After the last decisive turn
the reward is decided, so V = 1 on the tree there and later turns are not
enumerated. `value_tree` builds every such history level by level
(turn_length 1: one token per turn), scores each level with one batched
teacher-forced pass, and sums back from the leaves. ::

  values, credit = turn_credit(model, config, tokens, token_valid)
      values [B, K + 1]: V at each turn start of each row (V_K: its reward),
      credit [B, L]: A_k = V(h_(k+1)) - V(h_k) on turn k's action tokens.
  success(model, config)  J(pi): the expected reward of an episode.

The oracle the training loop reads (`tasks.Task.oracle`): `no_exact_oracle`, `exact_extras`
(turn credit on sampled episodes) and `held_out_success`.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit.tasks.key_token import FILL, SEP
from jaxcredit.tasks.key_turns.definition import KeyTurnsConfig

MAX_NODES = 500_000
ROWS_PER_PASS = 4096


@nnx.jit
def _last_logprobs(model, inputs):
  """[n, V] log pi(. | inputs[i]) at temperature 1; every token valid."""
  positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
  out = model(inputs, positions=positions, token_valid=jnp.ones(inputs.shape, bool))
  return jax.nn.log_softmax(out.logits[:, -1].astype(jnp.float32), axis=-1)


def _next_probs(model, histories: np.ndarray) -> np.ndarray:
  """[n, V] float64 next-token probabilities after each history, in padded row chunks."""
  n = len(histories)
  chunk = min(n, ROWS_PER_PASS)
  out = []
  for start in range(0, n, chunk):
    rows = histories[start:start + chunk]
    padded = np.concatenate([rows, np.repeat(rows[:1], chunk - len(rows), axis=0)])
    logprobs = np.asarray(_last_logprobs(model, jnp.asarray(padded)), np.float64)
    out.append(np.exp(logprobs[:len(rows)]))
  return np.concatenate(out)


def _observations(config: KeyTurnsConfig, turn: int) -> tuple[np.ndarray, float]:
  """[m, 2] the observations that can precede `turn` ([1, 0] after the last), and the
  probability of each (keys hidden until shown are uniform)."""
  if turn >= config.n_turns:
    return np.zeros((1, 0), np.int32), 1.0
  if turn in config.decisive:
    return np.stack([[k, SEP] for k in config.keys]).astype(np.int32), 1.0 / config.n_keys
  return np.asarray([[FILL, SEP]], np.int32), 1.0


def _check(config: KeyTurnsConfig, vocab: int) -> None:
  if config.turn_length != 1 or config.per_turn_rewards:
    raise ValueError("The exact key_turns oracle needs turn_length = 1 and the outcome rule "
                     f"(per_turn_rewards False); got turn_length = {config.turn_length}, "
                     f"per_turn_rewards = {config.per_turn_rewards}. Use Monte Carlo instead.")
  nodes, total = 1, 0
  for turn in range(_decided(config)):
    nodes *= len(_observations(config, turn)[0]) * (1 if turn in config.decisive else vocab)
    total += nodes
  if total > MAX_NODES:
    raise ValueError(f"The key_turns tree has {total} histories (> {MAX_NODES}): too many "
                     "non-decisive turns for exact values; use Monte Carlo.")


def _decided(config: KeyTurnsConfig) -> int:
  """The turn start after the last decisive turn, where the reward is decided."""
  return max(config.decisive) + 1


def value_tree(model, config: KeyTurnsConfig, prompt: np.ndarray) -> list[dict]:
  """The exact value of every reachable history at every turn start.

  Over every history whose decisive turns were all right; a later turn start has its
  ancestor's value there.

  Args:
    model: the policy.
    config: the task's `KeyTurnsConfig`.
    prompt: the episode's prompt ids.

  Returns:
    one ``{tuple(history ids): V}`` per turn start k = 0 .. the last decisive turn (the
    last: after the last decisive turn, V = 1).

  Raises:
    ValueError: for options or a vocabulary the oracle cannot enumerate.
  """
  vocab = model.config.vocab_size
  _check(config, vocab)
  observations, _ = _observations(config, 0)
  levels = [np.concatenate([np.tile(prompt, (len(observations), 1)), observations], axis=1)]
  links = []  # per turn: (parent of each child, pi(action) * P(observation))
  for turn in range(_decided(config)):
    nodes = levels[-1]
    probs = _next_probs(model, nodes)
    if turn in config.decisive:  # only the shown key continues
      actions = nodes[:, -2:-1]
      weight = np.take_along_axis(probs, actions, axis=1)
    else:
      actions = np.tile(np.arange(vocab, dtype=np.int32), (len(nodes), 1))
      weight = probs
    observations, chance = _observations(config, turn + 1)
    n, a, m = len(nodes), actions.shape[1], len(observations)
    children = np.concatenate([
        np.repeat(nodes, a * m, axis=0),
        np.repeat(actions.reshape(-1, 1), m, axis=0),
        np.tile(observations, (n * a, 1)),
    ], axis=1)
    links.append((np.repeat(np.arange(n), a * m), np.repeat(weight.reshape(-1), m) * chance))
    levels.append(children)
  values = [np.ones(len(levels[-1]))]
  for (parent, weight), nodes in zip(reversed(links), reversed(levels[:-1])):
    values.insert(0, np.bincount(parent, weight * values[0], minlength=len(nodes)))
  return [dict(zip(map(tuple, nodes.tolist()), v)) for nodes, v in zip(levels, values)]


def success(model, config: KeyTurnsConfig, prompt: np.ndarray) -> float:
  """``J(pi) = E[R]``: the value of the episode's start, averaged over the first observation.

  Args:
    model: the policy.
    config: the task's `KeyTurnsConfig`.
    prompt: the episode's prompt ids.

  Returns:
    the expected reward.
  """
  first = value_tree(model, config, prompt)[0]
  return float(np.mean(list(first.values())))


def turn_credit(model, config: KeyTurnsConfig, tokens: np.ndarray,
                token_valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The exact turn values and credit of episodes laid out by `rollout_sources.MultiTurn`
  (module docstring).

  Args:
    model: the policy.
    config: the task's `KeyTurnsConfig`.
    tokens: ``[B, L]`` int rows, each a whole episode after the same prompt.
    token_valid: ``[B, L]`` bool.

  Returns:
    ``(values [B, K + 1], credit [B, L])``.

  Raises:
    ValueError: when the rows are not whole episodes after one prompt.
  """
  tokens, token_valid = np.asarray(tokens), np.asarray(token_valid, bool)
  rows = [row[valid] for row, valid in zip(tokens, token_valid)]
  prompt = rows[0][:len(rows[0]) - config.episode_length]
  length = len(prompt) + config.episode_length
  if any(len(r) != length or not np.array_equal(r[:len(prompt)], prompt) for r in rows):
    raise ValueError("turn_credit needs whole key_turns episodes after one shared prompt: "
                     f"{len(prompt)} prompt ids and {config.episode_length} episode ids per row.")
  tree = value_tree(model, config, prompt)
  starts = [len(prompt) + 3 * k + 2 for k in range(config.n_turns)] + [len(rows[0])]
  decided = _decided(config)
  values = np.asarray([[tree[k].get(tuple(r[:starts[k]].tolist()), 0.0)
                        for k in range(decided + 1)] for r in rows])
  # Later turn starts keep the value where the outcome was decided.
  values = np.concatenate([values, np.repeat(values[:, -1:], config.n_turns - decided, 1)], 1)
  credit = np.zeros(tokens.shape)
  for b, valid in enumerate(token_valid):
    columns = np.flatnonzero(valid)
    for k, end in enumerate(starts[:-1]):
      credit[b, columns[end]] = values[b, k + 1] - values[b, k]
  return values, credit


def no_exact_oracle(config: KeyTurnsConfig) -> None:
  """Why a training run on this task under `config` has no exact oracle.

  Args:
    config: the task's `KeyTurnsConfig`.

  Returns:
    None: this task always has its exact oracle.
  """
  del config


def exact_extras(model, config: KeyTurnsConfig, rollout, examples) -> tuple[dict, dict]:
  """The exact credit of a training rollout, as rollout extras: the turn credit
  ``A_k = V(h_(k+1)) - V(h_k)`` on each turn's action, V(h_k) there as the value
  (`turn_credit`).

  Args:
    model: the policy that sampled the rollout.
    config: the task's `KeyTurnsConfig`.
    rollout: the sampled `Rollout`.
    examples: the task example of each row.

  Returns:
    ``({"oracle_advantages", "oracle_values"} [B, L], {"oracle_passes"})``.
  """
  del examples  # the episodes hold their observations
  values, credit = turn_credit(model, config, rollout.tokens, rollout.token_valid)
  before = np.zeros(credit.shape, np.float32)  # V(h_k) on turn k's action (one per turn)
  mask = np.asarray(rollout.mask, bool)
  for row in range(len(mask)):
    before[row, np.flatnonzero(mask[row])] = values[row, :mask[row].sum()]
  return ({"oracle_advantages": credit.astype(np.float32), "oracle_values": before},
          {"oracle_passes": 1})


def held_out_success(model, config: KeyTurnsConfig, examples) -> np.ndarray:
  """The exact success probability V(x) of each held-out example: every prompt is
  [BOS, SEP] (the keys are hidden), so each is J(pi) (`success`).

  Args:
    model: the policy.
    config: the task's `KeyTurnsConfig`.
    examples: the held-out examples.

  Returns:
    float64 ``[n]``.
  """
  return np.full(len(examples), success(model, config, np.asarray(examples[0]["prompt"])))
