"""Returns and GAE over LLM token masks.

All recursions run backwards over *valid* positions only: a masked position
(prompt, padding, tool output) is skipped, so "next" means the next valid
position, and after the last valid token the episode is terminal (V = 0,
A = 0). Outputs are 0 at masked positions.
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, sanitise

GAE_METHODS = ("scan",)


def _check_token_arrays(**arrays: Array) -> None:
  _checks.check_token_and_seq(arrays, {})


def _reverse_time_scan(step, init, *token_arrays: Array) -> Array:
  """Runs `step` from t = T-1 down to 0 over time-major views of [B, T] arrays.

  step(carry, xs_t) -> (carry, out_t), where xs_t holds the [B] slices at t.
  Returns the stacked outputs as [B, T].
  """
  xs = tuple(jnp.swapaxes(x, 0, 1) for x in token_arrays)
  _, out = jax.lax.scan(step, init, xs, reverse=True)
  return jnp.swapaxes(out, 0, 1)


def discounted_returns(rewards: Array, mask: Array, *, gamma: float) -> Array:
  """Discounted reward-to-go over valid positions: G_t = r_t + gamma * G_next.

  rewards, mask: [B, T]. G_next is the return at the next valid position (0
  after the last one). Returns float32 [B, T], 0 at masked positions.
  """
  _check_token_arrays(rewards=rewards, mask=mask)
  valid = as_bool(mask)
  rewards = sanitise(rewards, valid)

  def step(next_return, xs):
    reward, is_valid = xs
    ret = jnp.where(is_valid, reward + gamma * next_return, next_return)
    return ret, jnp.where(is_valid, ret, 0.0)

  init = jnp.zeros(rewards.shape[:1], jnp.float32)
  return _reverse_time_scan(step, init, rewards, valid)


def gae(
    rewards: Array,
    values: Array,
    mask: Array,
    *,
    gamma: float,
    lam: float,
    method: str = "scan",
) -> tuple[Array, Array]:
  """Generalised advantage estimation (Schulman et al., 2016).

  delta_t = r_t + gamma * V_next - V_t
  A_t     = delta_t + gamma * lam * A_next
  where "next" is the next valid position and V_next = A_next = 0 after the
  last valid token. rewards, values, mask: [B, T].
  Returns (advantages, returns) float32 [B, T], with returns = (A + V) * mask.
  method: "scan" (sequential scan over time).
  """
  _check_token_arrays(rewards=rewards, values=values, mask=mask)
  _checks.check_choice(method, GAE_METHODS, "GAE method")
  valid = as_bool(mask)
  rewards = sanitise(rewards, valid)
  values = sanitise(values, valid)

  def step(carry, xs):
    next_value, next_advantage = carry
    reward, value, is_valid = xs
    advantage = reward + gamma * next_value - value + gamma * lam * next_advantage
    carry = (
        jnp.where(is_valid, value, next_value),
        jnp.where(is_valid, advantage, next_advantage),
    )
    return carry, jnp.where(is_valid, advantage, 0.0)

  zeros = jnp.zeros(rewards.shape[:1], jnp.float32)
  advantages = _reverse_time_scan(step, (zeros, zeros), rewards, values, valid)
  return advantages, jnp.where(valid, advantages + values, 0.0)
