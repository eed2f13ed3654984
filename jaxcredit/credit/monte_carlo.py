"""Monte-Carlo values and credit from continuations of a policy's own rollouts (VinePPO).

V(s_t) is estimated by the mean reward of K continuations sampled from the
state s_t = row[:t] under the policy that produced the batch; with gamma = 1
and an outcome reward R, a segment's credit is V(next point) - V(point), and
V after the last action is R. `rao_blackwell` builds its credit on the same continuations.

  mc_credit(model, task, tokens, mask, token_valid, examples, key, k=..., positions=...)
  Continuations(...).returns(pairs)     [M, K] rewards of K continuations per (row, column)
  select_positions(mask, logprobs, spec)  where V is evaluated ("all", "stride:k", "cutpoints:tau")
  evaluated_positions(mask, logprobs, stride, threshold)  the same, traceable in its rule
  mc_value_stats(returns, valid)        means and standard errors of K returns per state

Rows use the training layout: [B, L] with L = P + N (a left-padded prompt,
then N response slots); `mask` marks actions. The credit lab scores these estimates
against the tasks' exact oracles.
"""

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit import tasks
from jaxcredit.estimators import segment_advantages, segment_endpoints
from jaxcredit.rollout import Credit
from jaxcredit.sampling import Actions, generate

_segment_advantages, _segment_endpoints = jax.jit(segment_advantages), jax.jit(segment_endpoints)
# Continuation keys are fold_in(key, MC_STREAM): never shared with an estimator's.
MC_STREAM = 0x0AC1E


def mc_value_stats(returns: Array, valid: Array, *,
                   binary: bool = True) -> tuple[Array, Array, Array]:
  """Mean, variance and standard error of K returns per state.

  Args:
    returns: ``[M, K]`` returns of K continuations per state.
    valid: ``[M, K]`` bool, the returns that count.
    binary: the returns are 0/1: the standard error uses the Agresti-Coull proportion
      ``(k + 2) / (K + 4)``, so 0/K or K/K successes never report SE = 0; otherwise the
      sample variance (ddof = 1).

  Returns:
    ``(mean, var, stderr)``, float32 ``[M]`` each; states with no valid return get mean 0
    and SE 0.5 (the largest a [0, 1] mean can have).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.credit import monte_carlo
    >>> mean, _, se = monte_carlo.mc_value_stats(jnp.array([[1.0, 1.0, 1.0, 1.0]]),
    ...                                          jnp.ones((1, 4), bool))
    >>> float(mean[0]), round(float(se[0]), 4)  # Agresti-Coull: (4 + 2) / (4 + 4)
    (1.0, 0.2165)
  """
  valid = jnp.asarray(valid, bool)
  count = jnp.sum(valid, axis=1)
  total = jnp.sum(jnp.where(valid, returns, 0.0), axis=1)
  mean = jnp.where(count > 0, total / jnp.maximum(count, 1), 0.0)
  squares = jnp.sum(jnp.where(valid, (returns - mean[:, None]) ** 2, 0.0), axis=1)
  var = squares / jnp.maximum(count - 1, 1)
  if binary:
    adjusted = (total + 2.0) / (count + 4.0)
    stderr = jnp.sqrt(adjusted * (1 - adjusted) / jnp.maximum(count, 1))
  else:
    stderr = jnp.sqrt(var / jnp.maximum(count, 1))
  return mean, var, jnp.where(count > 0, stderr, 0.5)


_mc_value_stats = jax.jit(mc_value_stats, static_argnames="binary")


def position_rule(spec: str) -> tuple[int, float]:
  """The rule of a positions spec: V(s_t) is evaluated at the actions whose rank r in their row
  has ``r % stride == 0`` and whose ``pi(y_t) < threshold``, and at every row's first action.

  Args:
    spec: "all" (every action), "stride:k" (every k-th action of the row) or
      "cutpoints:tau" (actions with pi(y_t) < tau: where the outcome can fork, as in SPO's
      cutpoints).

  Returns:
    ``(stride, threshold)``: (1, inf), (k, inf) or (1, tau).

  Raises:
    ValueError: on an unknown spec, a stride below 1 or a threshold outside [0, 1].

  Examples:
    >>> from jaxcredit.credit import monte_carlo
    >>> monte_carlo.position_rule("stride:4"), monte_carlo.position_rule("cutpoints:0.9")
    ((4, inf), (1, 0.9))
  """
  kind, _, arg = spec.partition(":")
  try:
    rule = {"all": lambda: (1, math.inf), "stride": lambda: (int(arg), math.inf),
            "cutpoints": lambda: (1, float(arg))}[kind]()
  except (KeyError, ValueError):
    raise ValueError(f"Unknown positions {spec!r}; known: all, stride:k, cutpoints:tau.") from None
  if rule[0] < 1 or (kind == "cutpoints" and not 0 <= rule[1] <= 1):
    raise ValueError(f"positions {spec!r}: a stride is >= 1 and a cutpoint threshold in [0, 1].")
  return rule


def evaluated_positions(mask: Array, logprobs: Array | None, stride, threshold) -> Array:
  """The actions where V(s_t) is evaluated under `position_rule`'s ``(stride, threshold)``.
  Traceable (stride and threshold may be traced).

  Args:
    mask: ``[B, L]`` bool, the actions.
    logprobs: ``[B, L]`` behaviour log-probs, or None (then no threshold applies).
    stride: every stride-th action of a row.
    threshold: actions with ``pi(y_t) < threshold`` (inf: every action).

  Returns:
    bool ``[B, L]``, a subset of `mask` holding every row's first action.
  """
  mask = jnp.asarray(mask, bool)
  index = jnp.cumsum(mask, axis=1) - 1  # rank of each action within its row
  chosen = mask & (index % stride == 0)
  if logprobs is not None:
    chosen &= jnp.exp(jnp.where(mask, logprobs, 0.0)) < threshold
  return chosen | (mask & (index == 0))


def select_positions(mask: Array, logprobs: Array | None, spec: str) -> Array:
  """Where a budgeted oracle evaluates V(s_t): `evaluated_positions` under the spec's
  `position_rule`. Every row's first action is always included (segments start there).

  Args:
    mask: ``[B, L]`` bool, the actions.
    logprobs: ``[B, L]`` behaviour log-probs, or None (needed by "cutpoints:tau").
    spec: "all", "stride:k" or "cutpoints:tau" (`position_rule`).

  Returns:
    bool ``[B, L]``, a subset of `mask`.

  Raises:
    ValueError: on an unknown spec, or cutpoints without log-probs.
  """
  stride, threshold = position_rule(spec)
  if logprobs is None and threshold < math.inf:
    raise ValueError("positions='cutpoints:tau' needs the behaviour logprobs.")
  return evaluated_positions(mask, logprobs, stride, threshold)


def _continuation_actions(allowed: np.ndarray, hidden: np.ndarray, width: int, hidden_token: int,
                          k: int) -> Actions:
  """Per-row Actions of continuation rows: `width` visible prompt columns, then
  the response steps' allowed [M, N, V] and hidden [M, N]; each row repeated k times."""
  rows, _, vocab = allowed.shape
  allowed = np.concatenate([np.ones((rows, width, vocab), bool), allowed], axis=1)
  hidden = np.concatenate([np.zeros((rows, width), bool), hidden], axis=1)
  return Actions(np.repeat(allowed, k, 0), np.repeat(hidden, k, 0), hidden_token)


class Continuations:
  """K sampled continuations from prefixes ``row[:column]`` of a batch, scored by the task,
  with the task's action sets and hidden steps.

  Args:
    model: the policy.
    task: the run's `TrainTask`.
    tokens: ``[B, L]`` int rows.
    mask: ``[B, L]`` bool, the actions.
    token_valid: ``[B, L]`` bool.
    examples: the B task examples.
    key: the continuations' PRNG key.
    k: continuations per prefix.
    temperature: the sampling temperature.
    max_rows: continuation rows sampled per call at most.
  """

  def __init__(self, model, task, tokens, mask, token_valid, examples, key, *, k, temperature,
               max_rows):
    self.model, self.task, self.examples = model, task, examples
    self.k, self.temperature = k, temperature
    self.tokens, self.mask, self.token_valid = tokens, mask, token_valid
    self.key, self.max_rows = key, max_rows
    n, response = task.max_response_length, task.actions.columns(task.max_prompt_length)
    # response step -> allowed actions, over the model's (maybe padded) vocabulary
    self.step_allowed = np.ones((2 * n, model.config.vocab_size), bool)
    if response.allowed is not None:  # one [V] set holds at every step
      self.step_allowed[:n if response.per_column else None] = response.allowed
    self.step_hidden = np.zeros(2 * n, bool)
    if response.hidden is not None:
      self.step_hidden[:n] = response.hidden
    self.observed = np.asarray(task.actions.observe(tokens))
    self.gen_tokens = self.prefill_tokens = self.rollouts = 0

  def returns(self, pairs: np.ndarray, *, ban: np.ndarray | None = None,
              stream: int = 0) -> np.ndarray:
    """[M, K] rewards of K continuations of prefix tokens[row, :column] per (row, column)
    pair; ban [M] (or None): a token id excluded at the first sampled step."""
    task, k = self.task, self.k
    prompt_len, n = task.max_prompt_length, task.max_response_length
    width = prompt_len + n
    # Prefixes per sampler call: a power of two (few compiled shapes), at most max_rows // k.
    per_chunk = int(min(max(1, self.max_rows // k), 2 ** math.ceil(math.log2(max(len(pairs), 1)))))
    out_returns = np.zeros((len(pairs), k))
    ban = np.full(len(pairs), -1) if ban is None else np.asarray(ban)
    for start in range(0, len(pairs), per_chunk):
      window = slice(start, start + per_chunk)
      chunk = np.concatenate([pairs[window], ban[window, None]], 1)
      # Padded to one compiled shape.
      padded = np.concatenate([chunk, np.repeat(chunk[-1:], per_chunk - len(chunk), 0)])
      rows, columns, banned = padded[:, 0], padded[:, 1], padded[:, 2]
      steps_done = columns - prompt_len  # response steps before the state
      source = np.arange(width)[None] - (width - columns)[:, None]  # prefix, left-padded to `width`
      inside = source >= 0
      source = np.clip(source, 0, width - 1)
      prompts = np.where(inside, self.observed[rows[:, None], source], task.pad_id).astype(np.int32)
      valid = inside & self.token_valid[rows[:, None], source]
      index = steps_done[:, None] + np.arange(n)[None]
      allowed = self.step_allowed[index]
      first = allowed[:, 0]
      drop = (banned >= 0) & (first.sum(1) > 1)  # never ban a state's only action
      first[drop, banned[drop]] = False
      out = generate(
          self.model, np.repeat(prompts, k, 0), np.repeat(valid, k, 0),
          jax.random.fold_in(jax.random.fold_in(self.key, stream), start), max_new_tokens=n,
          temperature=self.temperature, stop_tokens=task.stop_tokens, pad_id=task.pad_id,
          actions=_continuation_actions(allowed, self.step_hidden[index], width,
                                        task.actions.hidden_token, k))
      continuation, continued = np.asarray(out.tokens)[:, width:], np.asarray(out.mask)[:, width:]
      # The response: the row's own first `done` steps, then the continuation.
      done, row_of = np.repeat(steps_done, k)[:, None], np.repeat(rows, k)
      step = np.arange(n)[None]
      own = step < done
      from_continuation = np.clip(step - done, 0, n - 1)
      response = np.where(own, self.tokens[row_of[:, None], prompt_len + step],
                          np.take_along_axis(continuation, from_continuation, 1))
      response_mask = np.where(own, self.mask[row_of[:, None], prompt_len + step],
                               np.take_along_axis(continued, from_continuation, 1))
      scores = task.score(response, response_mask, [self.examples[r] for r in row_of])
      used = len(pairs[start:start + per_chunk])
      out_returns[start:start + used] = scores.reshape(-1, k)[:used]
      self.gen_tokens += int((continued & (step < n - done))[:used * k].sum())
      self.prefill_tokens += int(k * valid[:used].sum())
      self.rollouts += used * k
    return out_returns

  def cost(self) -> dict:
    return {
        "rollouts": self.rollouts,
        "gen_tokens": self.gen_tokens,
        "prefill_tokens": self.prefill_tokens,
        "tf_tokens": 0,
        "passes": 0
    }


def returns_stats(returns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The float64 mean and standard error of K returns per state.

  Args:
    returns: ``[M, K]`` returns (Agresti-Coull when they are all 0 or 1).

  Returns:
    ``(mean, stderr)``, float64 ``[M]`` each (see `mc_value_stats`).
  """
  binary = bool(np.isin(returns, (0.0, 1.0)).all())
  mean, _, stderr = _mc_value_stats(jnp.asarray(returns), jnp.ones(returns.shape, bool),
                                    binary=binary)
  return np.asarray(mean, np.float64), np.asarray(stderr, np.float64)


def mc_credit(model, task: tasks.TrainTask, tokens: np.ndarray, mask: np.ndarray,
              token_valid: np.ndarray, examples: Sequence[dict], key: Array, *, k: int,
              positions: str = "all", logprobs: np.ndarray | None = None, temperature: float = 1.0,
              max_rows: int = 4096) -> Credit:
  """Plain Monte-Carlo credit (VinePPO) at the positions `select_positions` picks.

  V(s_t) is the mean reward of `k` continuations from s_t; segment credit
  ``V(next point) - V(point)`` is copied to each segment's tokens, with
  ``adv_stderr = sqrt(SE_start^2 + SE_end^2)`` (independent rollout sets). Continuations use
  the task's action sets and hidden steps, so they follow the sampling policy.

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
    logprobs: ``[B, L]`` the behaviour log-probs (needed by "cutpoints:tau").
    temperature: the sampling temperature.
    max_rows: continuation rows sampled per call at most.

  Returns:
    a `Credit` of ``[B, L]`` arrays and the rollouts' cost.

  Raises:
    ValueError: when the rows are not ``[B, P + N]`` of the task, or on a bad spec.

  References:
    Kazemnejad et al., 2024, "VinePPO", arXiv 2410.01679.
  """
  start = MonteCarloStart.make(model, task, tokens, mask, token_valid, examples, key, k=k,
                               positions=positions, logprobs=logprobs, temperature=temperature,
                               max_rows=max_rows)
  tokens, mask, evaluated, pairs = start.tokens, start.mask, start.evaluated, start.pairs
  values, value_se = np.zeros(tokens.shape), np.zeros(tokens.shape)
  mean, stderr = returns_stats(start.sampler.returns(pairs))
  values[pairs[:, 0], pairs[:, 1]] = mean
  value_se[pairs[:, 0], pairs[:, 1]] = stderr
  advantages = _segment_advantages(jnp.asarray(values, jnp.float32), jnp.asarray(evaluated),
                                   jnp.asarray(start.rewards), jnp.asarray(mask))
  # The two endpoints of a segment use independent rollouts (the terminal reward has SE 0).
  se_start, se_end = _segment_endpoints(jnp.asarray(value_se, jnp.float32), jnp.asarray(evaluated),
                                        jnp.zeros(len(tokens)), jnp.asarray(mask))
  return Credit(advantages=advantages, values=jnp.asarray(values, jnp.float32),
                adv_stderr=jnp.hypot(se_start, se_end), evaluated=jnp.asarray(evaluated),
                cost=start.sampler.cost())


@dataclasses.dataclass(frozen=True)
class MonteCarloStart:
  """What every Monte-Carlo credit estimate starts from (`make` builds it, checked).

  Attributes:
    tokens: ``[B, L]`` the checked rows.
    mask: ``[B, L]`` bool, the actions.
    evaluated: ``[B, L]`` bool, the evaluated positions.
    pairs: ``[M, 2]`` their (row, column) pairs: the state before the action at column.
    rewards: ``[B]`` the rows' rewards.
    sampler: the `Continuations` (keys from ``fold_in(key, MC_STREAM)``).
  """

  tokens: np.ndarray
  mask: np.ndarray
  evaluated: np.ndarray
  pairs: np.ndarray
  rewards: np.ndarray
  sampler: Continuations

  @classmethod
  def make(cls, model, task: tasks.TrainTask, tokens, mask, token_valid, examples, key, *, k: int,
           positions: str, logprobs, temperature: float, max_rows: int) -> "MonteCarloStart":
    """ValueError unless the rows are [B, P + N] of the task."""
    tokens, mask, token_valid = (np.asarray(x) for x in (tokens, mask, token_valid))
    prompt_len, n = task.max_prompt_length, task.max_response_length
    if tokens.shape[1] != prompt_len + n:
      raise ValueError(f"Expected rows of {prompt_len} + {n} tokens, got {tokens.shape}.")
    evaluated = np.asarray(select_positions(mask, logprobs, positions))
    sampler = Continuations(model, task, tokens, mask, token_valid, examples,
                            jax.random.fold_in(key, MC_STREAM), k=k, temperature=temperature,
                            max_rows=max_rows)
    return cls(tokens, mask, evaluated, np.argwhere(evaluated),
               task.score_rows(tokens, mask, examples), sampler)
