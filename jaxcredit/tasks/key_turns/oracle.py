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
teacher-forced pass, and sums back from the leaves.

With hidden_actions the policy sees FILL for every action but a decisive turn's
first, so its conditionals depend only on the keys shown so far (a right
decisive action is the key shown before it). With decisive turns d_1 < ... < d_D
and p_i(k_1..k_i) = pi(k_i | the view after keys k_1..k_i), the keys uniform
and independent,

  V(h at d_i) = E_(k_(i+1)..k_D) prod_(m >= i) p_m    (k_1..k_i shown),
  V(h at k)   = E_(k_i..k_D) prod_(m >= i) p_m         (d_(i-1) < k < d_i),

on histories whose decisive turns were right so far (0 elsewhere, 1 after the
last). `key_probabilities` reads every p_i with one teacher-forced pass per
assignment of the D keys (n_keys^D rows, whatever the number of turns). ::

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

from jaxcredit.tasks.key_token import FILL
from jaxcredit.tasks.key_turns.definition import KeyTurnsConfig

MAX_NODES = 500_000
ROWS_PER_PASS = 4096
TOKENS_PER_PASS = 1 << 18


@nnx.jit
def _last_logprobs(model, inputs):
  """[n, V] log pi(. | inputs[i]) at temperature 1; every token valid."""
  positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
  out = model(inputs, positions=positions, token_valid=jnp.ones(inputs.shape, bool))
  return jax.nn.log_softmax(out.logits[:, -1].astype(jnp.float32), axis=-1)


@nnx.jit
def _column_logprobs(model, inputs, columns):
  """[n, c, V] log pi(. | inputs[i, :columns[j]]) at temperature 1; every token valid."""
  positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
  out = model(inputs, positions=positions, token_valid=jnp.ones(inputs.shape, bool))
  return jax.nn.log_softmax(out.logits[:, columns - 1].astype(jnp.float32), axis=-1)


def _in_chunks(rows: np.ndarray, chunk: int, score) -> np.ndarray:
  """float64 `score`(rows) in padded chunks of `chunk` rows (a few compiled shapes)."""
  n, chunk, out = len(rows), min(len(rows), chunk), []
  for start in range(0, n, chunk):
    part = rows[start:start + chunk]
    padded = np.concatenate([part, np.repeat(part[:1], chunk - len(part), axis=0)])
    out.append(np.asarray(score(jnp.asarray(padded)), np.float64)[:len(part)])
  return np.concatenate(out)


def _fed(config: KeyTurnsConfig, rows: np.ndarray, prompt_length: int) -> np.ndarray:
  """What the policy is fed for `rows` (a prompt, then episode columns): FILL at the hidden
  columns (`KeyTurnsConfig.actions`)."""
  return np.asarray(config.actions(prompt_length).columns(0, rows.shape[1]).observe(rows))


def _next_probs(model, config: KeyTurnsConfig, histories: np.ndarray,
                prompt_length: int) -> np.ndarray:
  """[n, V] float64 next-token probabilities after each history, in padded row chunks."""
  fed = _fed(config, histories, prompt_length)
  return np.exp(_in_chunks(fed, ROWS_PER_PASS, lambda rows: _last_logprobs(model, rows)))


def _observations(config: KeyTurnsConfig, turn: int) -> tuple[np.ndarray, float]:
  """[m, observation_length] the observations that can precede `turn` ([1, 0] after the
  last), and the probability of each (keys hidden until shown are uniform)."""
  if turn >= config.n_turns:
    return np.zeros((1, 0), np.int32), 1.0
  if turn in config.decisive:
    return (np.stack([config.observation(turn, {turn: k}) for k in config.keys]),
            1.0 / config.n_keys)
  return config.observation(turn, {})[None], 1.0


def _check_rule(config: KeyTurnsConfig) -> None:
  if config.per_turn_rewards:
    raise ValueError("The exact key_turns oracle needs the outcome rule (per_turn_rewards "
                     "False). Use Monte Carlo instead.")


def _check_tree(config: KeyTurnsConfig, vocab: int) -> None:
  _check_rule(config)
  if config.turn_length != 1:
    raise ValueError("The exact key_turns oracle needs turn_length = 1 when actions are seen "
                     f"(hidden_actions False); got turn_length = {config.turn_length}. Set "
                     "hidden_actions or use Monte Carlo instead.")
  nodes, total = 1, 0
  for turn in range(_decided(config)):
    nodes *= len(_observations(config, turn)[0]) * (1 if turn in config.decisive else vocab)
    total += nodes
  if total > MAX_NODES:
    raise ValueError(f"The key_turns tree has {total} histories (> {MAX_NODES}): too many "
                     "non-decisive turns for exact values; set hidden_actions or use Monte "
                     "Carlo.")


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
  _check_tree(config, vocab)
  observations, _ = _observations(config, 0)
  levels = [np.concatenate([np.tile(prompt, (len(observations), 1)), observations], axis=1)]
  links = []  # per turn: (parent of each child, pi(action) * P(observation))
  for turn in range(_decided(config)):
    nodes = levels[-1]
    probs = _next_probs(model, config, nodes, len(prompt))
    if turn in config.decisive:  # only the shown key continues
      actions = nodes[:, -config.observation_length, None]
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


MAX_ASSIGNMENTS = 65_536


def key_probabilities(model, config: KeyTurnsConfig, prompt: np.ndarray) -> np.ndarray:
  """With hidden_actions: the policy's probability of the right key at each decisive turn,
  for every assignment of the D decisive keys (module docstring).

  Args:
    model: the policy.
    config: the task's `KeyTurnsConfig` (hidden_actions set).
    prompt: the episode's prompt ids.

  Returns:
    float64 ``[n_keys] * D + [D]``: ``p[k_1, ..., k_D, i] = pi(key k_i | the view after keys
    k_1..k_i)`` (independent of the later keys).

  Raises:
    ValueError: without hidden_actions, under per-turn rewards, or for more than
      MAX_ASSIGNMENTS key assignments.
  """
  _check_rule(config)
  n, depth = config.n_keys, len(config.decisive)
  if not config.hidden_actions or n**depth > MAX_ASSIGNMENTS:
    raise ValueError("key_probabilities needs hidden_actions and n_keys^|decisive| <= "
                     f"{MAX_ASSIGNMENTS}; got hidden_actions = {config.hidden_actions}, "
                     f"{n}^{depth} assignments.")
  assignments = np.indices([n] * depth).reshape(depth, -1).T
  keys = config.keys[assignments]
  episode = np.concatenate([np.concatenate([config.observation(k, {k: FILL}),
                                            np.full(config.turn_length, FILL)])
                            for k in range(config.n_turns)]).astype(np.int32)
  rows = np.tile(np.concatenate([np.asarray(prompt, np.int32), episode]), (len(keys), 1))
  actions = len(prompt) + np.asarray([config.turn_start(d) for d in config.decisive])
  rows[:, actions - config.observation_length] = keys  # shown before the turn
  rows[:, actions] = keys  # the right action
  chunk = max(1, TOKENS_PER_PASS // rows.shape[1])
  logprobs = _in_chunks(rows, chunk,
                        lambda part: _column_logprobs(model, part, jnp.asarray(actions)))
  probs = np.exp(np.take_along_axis(logprobs, keys[..., None], axis=-1)[..., 0])
  return probs.reshape([n] * depth + [depth])


def _key_values(probabilities: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """(at, before): at[i] [n] * (i + 1), V at decisive turn d_i's start given k_1..k_i;
  before[i] [n] * i, V at a turn start between d_(i-1) and d_i given k_1..k_(i-1)."""
  depth = probabilities.shape[-1]
  rest = np.flip(np.cumprod(np.flip(probabilities, -1), -1), -1)  # prod_(m >= i) p_m
  at = [rest[..., i].mean(axis=tuple(range(i + 1, depth))) for i in range(depth)]
  before = [rest[..., i].mean(axis=tuple(range(i, depth))) for i in range(depth)]
  return at, before


def _hidden_turn_values(model, config: KeyTurnsConfig, prompt: np.ndarray,
                        episodes: np.ndarray) -> np.ndarray:
  """[B, n_turns + 1] V at every turn start of each episode (its columns after the prompt),
  hidden_actions (module docstring)."""
  at, before = _key_values(key_probabilities(model, config, prompt))
  decisive = np.asarray(config.decisive)
  shown = episodes[:, decisive * config.turn_width] - config.keys[0]
  taken = episodes[:, [config.turn_start(d) for d in decisive]]
  right = taken == config.keys[shown]
  values = np.zeros((len(episodes), config.n_turns + 1))
  for row, (keys, ok) in enumerate(zip(shown, right)):
    first = 0
    for i, turn in enumerate(decisive):
      values[row, first:turn] = before[i][tuple(keys[:i])]
      values[row, turn] = at[i][tuple(keys[:i + 1])]
      first = turn + 1
      if not ok[i]:
        break
    else:
      values[row, first:] = 1.0
  return values


def success(model, config: KeyTurnsConfig, prompt: np.ndarray) -> float:
  """``J(pi) = E[R]``: the value of the episode's start, averaged over the first observation.

  Args:
    model: the policy.
    config: the task's `KeyTurnsConfig`.
    prompt: the episode's prompt ids.

  Returns:
    the expected reward.
  """
  if config.hidden_actions:
    return float(_key_values(key_probabilities(model, config, prompt))[1][0])
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
    ``(values [B, K + 1], credit [B, L])``: the credit on each turn's first action token.

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
  starts = [len(prompt) + config.turn_start(k) for k in range(config.n_turns)]
  if config.hidden_actions:
    values = _hidden_turn_values(model, config, prompt, np.stack(rows)[:, len(prompt):])
  else:
    tree, decided = value_tree(model, config, prompt), _decided(config)
    ends = starts + [length]
    values = np.asarray([[tree[k].get(tuple(r[:ends[k]].tolist()), 0.0)
                          for k in range(decided + 1)] for r in rows])
    # Later turn starts keep the value where the outcome was decided.
    values = np.concatenate([values, np.repeat(values[:, -1:], config.n_turns - decided, 1)], 1)
  credit = np.zeros(tokens.shape)
  for b, valid in enumerate(token_valid):
    columns = np.flatnonzero(valid)
    credit[b, columns[starts]] = values[b, 1:] - values[b, :-1]
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
  mask, turn_ids = np.asarray(rollout.mask, bool), np.asarray(rollout.turn_ids)
  # V(h_k) on each of turn k's actions.
  before = np.where(mask, np.take_along_axis(values, np.maximum(turn_ids, 0), 1), 0.0)
  before = before.astype(np.float32)
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
