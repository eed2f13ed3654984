"""Oracle token credit A(s_t, y_t) = Q(s_t, y_t) - V(s_t) under the policy that
sampled a batch: exact on key_token (filler-blind), Monte Carlo anywhere.

Rows use the training layout: [B, L] with L = P + N (a left-padded prompt,
then N response slots); `mask` marks actions. With gamma = 1 and an outcome
reward R, A_t = V(s_{t+1}) - V(s_t) and V after the last action is R.

  decisive_credit(model, task_config, tokens, mask, rewards)   exact (E-DEC, LAB.md 1.1)
  mc_credit(model, task, tokens, mask, token_valid, examples, key, k=..., positions=...)
                                                                plain Monte Carlo (VinePPO)

Pure helpers: `mc_value_stats` (means and standard errors of K returns per
state) and `select_positions` (where a budgeted oracle evaluates V).
"""

import itertools
import math
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit.estimators import segment_advantages, segment_endpoints
from jaxcredit.sampling import generate
from jaxcredit.sampling.sampler import mask_logits, observed_inputs
from jaxcredit.tasks import key_token
from jaxcredit.train import tasks

_segment_advantages, _segment_endpoints = jax.jit(segment_advantages), jax.jit(segment_endpoints)
ORACLE_STREAM = 0x0AC1E  # oracle keys are fold_in(key, ORACLE_STREAM): never shared with an estimator's


@chex.dataclass(frozen=True)
class OracleCredit:
  """advantages [B, L]: A(s_t, y_t) at actions (0 elsewhere); values [B, L]: V(s_t)
  where evaluated; adv_stderr [B, L]: 0 for exact oracles, the Monte-Carlo
  standard error otherwise; evaluated [B, L] bool: V is known there; cost:
  rollouts, gen_tokens, prefill_tokens and tf_tokens (teacher-forced) spent."""

  advantages: Array
  values: Array
  adv_stderr: Array
  evaluated: Array
  cost: dict


def mc_value_stats(returns: Array, valid: Array, *, binary: bool = True) -> tuple[Array, Array, Array]:
  """Mean, variance and standard error of K returns per state.

  returns, valid: [M, K]. binary=True: the standard error uses the
  Agresti-Coull proportion (k + 2) / (K + 4), so 0/K or K/K successes never
  report SE = 0; otherwise the sample variance (ddof = 1). States with no
  valid return get mean 0 and SE 0.5 (the largest a [0, 1] mean can have).
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


def select_positions(mask: Array, logprobs: Array | None, spec: str) -> Array:
  """[B, L] bool: where a budgeted oracle evaluates V(s_t). Every row's first
  action is always included (segments start there).

  spec: "all" (every action), "stride:k" (every k-th action of the row),
  "cutpoints:tau" (actions with pi(y_t) < tau: where the outcome can fork,
  as in SPO's cutpoints).
  """
  mask = jnp.asarray(mask, bool)
  index = jnp.cumsum(mask, axis=1) - 1  # rank of each action within its row
  first = mask & (index == 0)
  kind, _, arg = spec.partition(":")
  if kind == "all":
    return mask
  if kind == "stride":
    return mask & (index % int(arg) == 0)
  if kind == "cutpoints":
    if logprobs is None:
      raise ValueError("positions='cutpoints:tau' needs the behaviour logprobs.")
    return first | (mask & (jnp.exp(logprobs) < float(arg)))
  raise ValueError(f"Unknown positions {spec!r}; known: all, stride:k, cutpoints:tau.")


def _teacher_forced_logprobs(model, inputs: np.ndarray, allowed: np.ndarray) -> np.ndarray:
  """[n, L, V] float64: [:, i] is log pi(. | inputs[:, :i + 1]), the distribution
  of token i + 1, restricted to allowed[i + 1] (allowed: [L, V] over row columns)."""
  out = model(jnp.asarray(inputs), positions=jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape),
              token_valid=jnp.ones(inputs.shape, bool))
  allowed_next = np.concatenate([allowed[1:], np.ones_like(allowed[:1])])
  logits = mask_logits(out.logits.astype(jnp.float32), jnp.asarray(allowed_next))
  return np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)


def decisive_credit(model, config: key_token.KeyTokenConfig, tokens: np.ndarray, mask: np.ndarray,
                    targets: np.ndarray) -> OracleCredit:
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
  allowed = np.concatenate([np.ones((prompt_len, key_token.VOCAB_SIZE), bool), key_token.allowed(config)])
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
    logp = _teacher_forced_logprobs(model, np.concatenate([np.tile(prompt, (len(prefixes), 1)), response], 1),
                                     allowed)
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
  return OracleCredit(
      advantages=jnp.asarray(advantages, jnp.float32), values=jnp.asarray(values, jnp.float32),
      adv_stderr=jnp.zeros(tokens.shape, jnp.float32), evaluated=jnp.asarray(mask),
      cost={"passes": passes, "tf_tokens": passes * tokens.shape[1], "rollouts": 0, "gen_tokens": 0,
            "prefill_tokens": 0},
  )


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


class _Continuations:
  """K sampled continuations from prefixes row[:column] of a batch, scored by the task."""

  def __init__(self, model, task, tokens, mask, token_valid, examples, key, *, k, temperature, max_rows):
    self.model, self.task, self.examples, self.k, self.temperature = model, task, examples, k, temperature
    self.tokens, self.mask, self.token_valid = tokens, mask, token_valid
    self.key, self.max_rows = key, max_rows
    n = task.max_response_length
    self.step_allowed = np.ones((2 * n, task.vocab_size), bool)  # response step -> allowed actions
    if task.action_mask is not None:
      self.step_allowed[:n] = task.action_mask
    self.step_hidden = np.zeros(2 * n, bool)
    if task.hidden is not None:
      self.step_hidden[:n] = task.hidden
    _, hidden_rows = tasks.row_tables(task)
    self.observed = np.asarray(observed_inputs(tokens, hidden_rows, task.hidden_token))
    self.gen_tokens = self.prefill_tokens = self.rollouts = 0

  def returns(self, pairs: np.ndarray, *, ban: np.ndarray | None = None, stream: int = 0) -> np.ndarray:
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
      chunk = np.concatenate([pairs[start:start + per_chunk], ban[start:start + per_chunk, None]], 1)
      padded = np.concatenate([chunk, np.repeat(chunk[-1:], per_chunk - len(chunk), 0)])  # one compiled shape
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
      out = generate(self.model, np.repeat(prompts, k, 0), np.repeat(valid, k, 0),
                     jax.random.fold_in(jax.random.fold_in(self.key, stream), start), max_new_tokens=n,
                     temperature=self.temperature, stop_tokens=task.stop_tokens, pad_id=task.pad_id,
                     action_mask=np.repeat(allowed, k, 0), hidden=np.repeat(self.step_hidden[index], k, 0),
                     hidden_token=task.hidden_token)
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
    return {"rollouts": self.rollouts, "gen_tokens": self.gen_tokens, "prefill_tokens": self.prefill_tokens,
            "tf_tokens": 0, "passes": 0}


def _stats(returns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  binary = bool(np.isin(returns, (0.0, 1.0)).all())
  mean, _, stderr = mc_value_stats(jnp.asarray(returns), jnp.ones(returns.shape, bool), binary=binary)
  return np.asarray(mean, np.float64), np.asarray(stderr, np.float64)


def mc_credit(model, task: tasks.TrainTask, tokens: np.ndarray, mask: np.ndarray, token_valid: np.ndarray,
              examples: Sequence[dict], key: Array, *, k: int, positions: str = "all", estimator: str = "plain",
              logprobs: np.ndarray | None = None, temperature: float = 1.0,
              max_rows: int = 4096) -> OracleCredit:
  """Monte-Carlo credit at the positions `select_positions` picks.

  estimator="plain" (VinePPO): V(s_t) is the mean reward of `k` continuations
  from s_t; segment credit V(next point) - V(point) is copied to each
  segment's tokens, adv_stderr = sqrt(SE_start^2 + SE_end^2) (independent
  rollout sets). estimator="rb": A_t = (1 - pi_t)(Q_y - Q_-) from k
  continuations of s_t + y_t and k of s_t with y_t banned at the first step
  (`rb_advantages`; 2k rollouts per position, needs `logprobs`); unevaluated
  actions get 0 with adv_stderr 0.

  tokens, mask, token_valid: [B, L] rows as the trainer lays them out;
  examples: the B task examples (for the reward). Continuations use the
  task's action sets and hidden steps, so they follow the sampling policy.
  """
  tokens, mask, token_valid = (np.asarray(x) for x in (tokens, mask, token_valid))
  prompt_len, n = task.max_prompt_length, task.max_response_length
  if tokens.shape[1] != prompt_len + n:
    raise ValueError(f"Expected rows of {prompt_len} + {n} tokens, got {tokens.shape}.")
  if estimator not in ("plain", "rb"):
    raise ValueError(f"Unknown Monte-Carlo estimator {estimator!r}; known: plain, rb.")
  if estimator == "rb" and logprobs is None:
    raise ValueError("estimator='rb' needs the behaviour logprobs (pi(y_t | s_t)).")
  evaluated = np.asarray(select_positions(mask, logprobs, positions))
  pairs = np.argwhere(evaluated)  # (row, column): the state before the action at column
  sampler = _Continuations(model, task, tokens, mask, token_valid, examples, jax.random.fold_in(key, ORACLE_STREAM),
                           k=k, temperature=temperature, max_rows=max_rows)
  rewards = task.score_rows(tokens, mask, examples)
  values, value_se = np.zeros(tokens.shape), np.zeros(tokens.shape)
  if estimator == "rb":
    rows, columns = pairs[:, 0], pairs[:, 1]
    last = columns == (mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1))[rows]  # the row's last action
    q_y, se_y = _stats(sampler.returns(np.stack([rows, columns + 1], 1), stream=1))
    q_y, se_y = np.where(last, rewards[rows], q_y), np.where(last, 0.0, se_y)  # Q(s_T-1, y) = R
    q_minus, se_minus = _stats(sampler.returns(pairs, ban=tokens[rows, columns], stream=2))
    p_taken = np.exp(np.asarray(logprobs, np.float64)[rows, columns])
    adv, se = (np.asarray(x) for x in rb_advantages(q_y, q_minus, p_taken, se_y, se_minus))
    advantages, adv_stderr = np.zeros(tokens.shape), np.zeros(tokens.shape)
    advantages[rows, columns], adv_stderr[rows, columns] = adv, se
    values[rows, columns] = p_taken * q_y + (1 - p_taken) * q_minus  # an unbiased V(s_t)
    return OracleCredit(advantages=jnp.asarray(advantages, jnp.float32), values=jnp.asarray(values, jnp.float32),
                        adv_stderr=jnp.asarray(adv_stderr, jnp.float32), evaluated=jnp.asarray(evaluated),
                        cost=sampler.cost())
  mean, stderr = _stats(sampler.returns(pairs))
  values[pairs[:, 0], pairs[:, 1]] = mean
  value_se[pairs[:, 0], pairs[:, 1]] = stderr
  advantages = _segment_advantages(jnp.asarray(values, jnp.float32), jnp.asarray(evaluated),
                                   jnp.asarray(rewards), jnp.asarray(mask))
  # The two endpoints of a segment use independent rollouts (the terminal reward has SE 0).
  se_start, se_end = _segment_endpoints(jnp.asarray(value_se, jnp.float32), jnp.asarray(evaluated),
                                        jnp.zeros(len(tokens)), jnp.asarray(mask))
  return OracleCredit(
      advantages=advantages, values=jnp.asarray(values, jnp.float32),
      adv_stderr=jnp.hypot(se_start, se_end), evaluated=jnp.asarray(evaluated), cost=sampler.cost(),
  )
