"""The batch that estimators and losses read: what was sampled and scored.

Layout: `[B, T]` token arrays, `[B]` sequence arrays; rows
`g*G ... g*G+G-1` answer the same prompt when `group_size=G`.
"""

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks

_TOKEN_FIELDS = (
    "tokens", "mask", "behaviour_logprobs", "old_logprobs", "ref_logprobs", "values",
    "token_rewards", "entropy", "positions", "token_valid", "turn_ids",
)


class MissingFields(ValueError):
  """A ValueError saying that a function needs Rollout fields that are None.

  Attributes:
    fields: the names of the missing `Rollout` fields (e.g. `("values",)`), so a
      caller can say which setting provides each.
  """

  def __init__(self, fields: tuple[str, ...], message: str):
    super().__init__(message)
    self.fields = fields


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rollout:
  """Sampled responses with their rewards (a pytree; `group_size` is static).

  Attributes:
    tokens: ``[B, T]`` int, prompt + response token ids.
    mask: ``[B, T]``, True (or 1.0) where the token is a policy action.
    rewards: ``[B]``, the outcome reward of each response (verifier score).
    behaviour_logprobs: ``[B, T]`` or None, log-probs of the sampled tokens as the sampler
      computed them while sampling (the behaviour policy mu).
    old_logprobs: ``[B, T]`` or None, the learner's recomputation of them under the
      parameters it holds before this batch's updates (the proximal policy pi_old of
      decoupled PPO; None when the learner does not recompute).
    ref_logprobs: ``[B, T]`` or None, log-probs under the frozen reference policy.
    values: ``[B, T]`` or None, critic values V(s_t) at each action.
    token_rewards: ``[B, T]`` or None, dense rewards (process rewards, shaping) added to
      the outcome reward placed on the last action.
    entropy: ``[B, T]`` or None, the behaviour policy's entropy at each position.
    truncated: ``[B]`` bool or None, the response was cut off by the token budget (no
      stop token); the task scored it by its rule.
    staleness: ``[B]`` int or None, how many learner updates older than the learner's
      current parameters the sampling parameters were.
    positions: ``[B, T]`` int or None, RoPE positions of the tokens for a teacher-forced
      pass (None: counted over `token_valid` from 0).
    token_valid: ``[B, T]`` bool or None, real tokens, prompt and response (None: all);
      padding is invisible to attention.
    turn_ids: ``[B, T]`` int or None, the turn of each token in a multi-turn episode: the
      turn's actions and the observation answering them (`rollout_sources.MultiTurn`); -1
      outside any turn.
    extras: further arrays an estimator needs, by name (e.g. ``"baseline_rewards"``
      ``[B]`` for ReMax, ``"sum_pi_squared"`` ``[B, T]`` for OTB).
    group_size: static int, responses per prompt, in contiguous rows.
  """

  tokens: Array
  mask: Array
  rewards: Array
  behaviour_logprobs: Array | None = None
  old_logprobs: Array | None = None
  ref_logprobs: Array | None = None
  values: Array | None = None
  token_rewards: Array | None = None
  entropy: Array | None = None
  truncated: Array | None = None
  staleness: Array | None = None
  positions: Array | None = None
  token_valid: Array | None = None
  turn_ids: Array | None = None
  extras: Mapping[str, Array] = dataclasses.field(default_factory=dict)
  group_size: int = dataclasses.field(default=1, metadata=dict(static=True))

  def replace(self, **changes) -> "Rollout":
    return dataclasses.replace(self, **changes)

  @property
  def shape(self) -> tuple[int, int]:
    """(B, T)."""
    return tuple(self.tokens.shape)

  def check(self) -> "Rollout":
    """Raises ValueError on inconsistent shapes or group size; returns self."""
    _checks.check_token_and_seq({f: getattr(self, f) for f in _TOKEN_FIELDS}, {
        "rewards": self.rewards,
        "truncated": self.truncated,
        "staleness": self.staleness,
    })
    _checks.check_group_size(self.tokens.shape[0], self.group_size)
    return self

  def require(self, *fields: str, by: str) -> None:
    """Raises `MissingFields` (a ValueError) naming `by` if any of `fields` is None."""
    missing = [f for f in fields if getattr(self, f) is None]
    if missing:
      raise MissingFields(tuple(missing), f"{by} needs rollout.{', rollout.'.join(missing)}, "
                          "which is None.")

  def proximal_logprobs(self, *, by: str) -> Array:
    """[B, T] log-probs a ratio loss's trust region is anchored at: old_logprobs
    when the learner recomputed them, else behaviour_logprobs (synchronous training
    that trusts the sampler's numbers). ValueError naming `by` when neither is set."""
    if self.old_logprobs is not None:
      return self.old_logprobs
    self.require("behaviour_logprobs", by=by)
    return self.behaviour_logprobs

  def extra(self, name: str, *, by: str, per: str = "token") -> Array:
    """rollout.extras[name], which must be [B, T] (per="token"), [B] (per="sequence") or
    [B, K] for any K (per="vector"); ValueError naming `by`, the key and the shapes if it is
    absent or mis-shaped (a [B, 1] or [T] array would otherwise broadcast)."""
    if name not in self.extras:
      raise ValueError(
          f"{by} needs rollout.extras[{name!r}]; extras has {sorted(self.extras)}."
      )
    value = self.extras[name]
    shape = tuple(jnp.shape(value))
    if per == "vector":
      if len(shape) != 2 or shape[0] != self.shape[0]:
        raise ValueError(f"{by} needs rollout.extras[{name!r}] of shape [B, K] with "
                         f"B = {self.shape[0]}, got {list(shape)}.")
      return value
    expected = {"token": self.shape, "sequence": self.shape[:1]}[per]
    if shape != expected:
      layout = "[B, T]" if per == "token" else "[B]"
      raise ValueError(
          f"{by} needs rollout.extras[{name!r}] of shape {layout} = {list(expected)}, "
          f"got {list(shape)}."
      )
    return value


class Estimate(NamedTuple):
  """What an estimator returns: token advantages and, where it has them, returns.

  Attributes:
    advantages: ``[B, T]`` float32, 0 at masked positions.
    returns: ``[B, T]`` float32 value targets, or None.
  """

  advantages: Array
  returns: Array | None = None


class PolicyOutputs(NamedTuple):
  """What the policy being trained computes on a rollout's tokens.

  Attributes:
    logprobs: ``[B, T]`` log-probs of the rollout's tokens under the current policy.
    entropy: ``[B, T]`` per-token entropy, or None.
    values: ``[B, T]`` current critic values, or None.
  """

  logprobs: Array
  entropy: Array | None = None
  values: Array | None = None


@chex.dataclass(frozen=True)
class Credit:
  """Token credit ``A(s_t, y_t) = Q(s_t, y_t) - V(s_t)``, exact or estimated.

  Attributes:
    advantages: ``[B, L]`` A(s_t, y_t) at actions, 0 elsewhere.
    values: ``[B, L]`` V(s_t) where evaluated.
    adv_stderr: ``[B, L]`` 0 for exact oracles, the Monte-Carlo standard error otherwise.
    evaluated: ``[B, L]`` bool, V is known there.
    cost: the rollouts, gen_tokens, prefill_tokens and tf_tokens (teacher-forced) spent.
  """

  advantages: Array
  values: Array
  adv_stderr: Array
  evaluated: Array
  cost: dict
