"""Group baselines that weigh responses by their length: OPO's length-weighted baseline and
lambda-GRPO's learnable length preference.

rewards, lengths: [B] with `group_size` = G contiguous rows per prompt; B % G == 0.
"""

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import safe_divide, scale_down
from jaxcredit.estimators.group import _centred, _grouped, _std_normalised, grpo_advantages

def opo_advantages(rewards: Array, lengths: Array, *, group_size: int) -> Array:
  """Length-weighted baseline (OPO)::

    b_g = sum_j l_j r_j / sum_j l_j,    A_i = r_i - b_g

  with l_j the number of response tokens of row j in the group.

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` contiguous rows.
    lengths: ``[B]`` response lengths in tokens.
    group_size: G, responses per prompt.

  Returns:
    float32 ``[B]``; a group whose lengths sum to 0 gets b_g = 0; 0 when G == 1.

  Raises:
    ValueError: when `group_size` does not divide B or the shapes differ.

  References:
    Hao et al., 2025, "On-Policy RL with Optimal Reward Baseline", arXiv 2505.23585.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.opo_advantages(jnp.array([1.0, 0.0]), jnp.array([1, 3]), group_size=2)
    Array([ 0.75, -0.25], dtype=float32)
  """
  grouped = _grouped(rewards, group_size)
  _checks.check_same_shape(rewards=rewards, lengths=lengths)
  if group_size == 1:
    return jnp.zeros(rewards.shape, jnp.float32)
  weights = lengths.astype(jnp.float32).reshape(grouped.shape)
  scaled, scale = scale_down(grouped, axis=1)
  baseline = safe_divide(jnp.sum(weights * scaled, 1, keepdims=True),
                         jnp.sum(weights, 1, keepdims=True))
  return ((scaled - baseline) * scale).reshape(-1)


_EXPONENT_CAP = 80.0  # h^lambda = exp(lambda log h) stays finite in float32 (e^80 ~ 5.5e34)


def lambda_grpo_weights(lengths: Array, *, group_size: int, lam: Array | float, r: float = 1.0,
                        h_min: float = 1e-3, eps: float = 1e-6) -> Array:
  """lambda-GRPO's response weights: a group's length preference, learnable through `lam`::

    z_i = (l_i - mean_g l) / (std_g l + eps),    h_i = max(1 + r z_i, h_min),
    f_i = G softmax_g(h_i^lam)

  with l_i the response lengths and the std over the group's G lengths (ddof = 1). The
  weights average 1 over each group; ``lam = 0`` weighs every response alike (DAPO's
  token-mean aggregation), ``lam > 0`` favours a group's longer responses and ``lam < 0``
  its shorter ones. `h_min` keeps h_i^lam defined where 1 + r z_i <= 0, and the exponent
  lam log h_i is capped at 80, so no finite `lam` overflows. Differentiable in `lam`.

  Args:
    lengths: ``[B]`` response lengths in tokens, groups of `group_size` contiguous rows.
    group_size: G, responses per prompt.
    lam: the preference exponent, a scalar (a learnable parameter or a constant).
    r: how far the standardised lengths move h from 1.
    h_min: the least h (> 0).
    eps: added to the lengths' std.

  Returns:
    float32 ``[B]``; 1 for a group of equal lengths and when G == 1.

  Raises:
    ValueError: when `group_size` does not divide B, or `h_min` is not positive.

  References:
    Wang et al., 2025, "lambda-GRPO: Unifying the GRPO Frameworks with Learnable Token
    Preferences", arXiv 2510.06870.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> lengths = jnp.array([2, 6, 4, 4])
    >>> estimators.lambda_grpo_weights(lengths, group_size=2, lam=1.0, r=0.5).round(4)
    Array([0.6605, 1.3395, 1.    , 1.    ], dtype=float32)
  """
  grouped = _grouped(lengths, group_size)
  _checks.check_in_range(h_min, "h_min", low=0.0, low_open=True)
  if group_size == 1:
    return jnp.ones(lengths.shape, jnp.float32)
  centred, scale = _centred(grouped)
  h = jnp.maximum(1.0 + r * _std_normalised(centred, scale, group_size - 1, eps), h_min)
  preference = jnp.exp(jnp.minimum(jnp.asarray(lam, jnp.float32) * jnp.log(h), _EXPONENT_CAP))
  return (group_size * jax.nn.softmax(preference, axis=1)).reshape(-1)


def lambda_grpo_advantages(rewards: Array, lengths: Array, *, group_size: int,
                           lam: Array | float, r: float = 1.0, h_min: float = 1e-3,
                           eps: float = 1e-6) -> Array:
  """lambda-GRPO: GRPO's advantages weighed by the group's length preference::

    A_i = f_i (r_i - mean_g r) / (std_g r + eps)

  with f_i `lambda_grpo_weights`; under token-mean aggregation the loss is
  ``sum_i f_i A_i sum_t ratio_it / sum_i l_i`` (GRPO's 1 / l_i and DAPO's uniform
  token weights are special cases of such per-response weights).

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` contiguous rows.
    lengths: ``[B]`` response lengths in tokens.
    group_size: G, responses per prompt.
    lam: the preference exponent (scalar).
    r: how far the standardised lengths move h from 1.
    h_min: the least h (> 0).
    eps: added to the stds of rewards and lengths.

  Returns:
    float32 ``[B]``; 0 for a zero-variance group and when G == 1.

  Raises:
    ValueError: when `group_size` does not divide B or the shapes differ.

  References:
    Wang et al., 2025, arXiv 2510.06870 (as `lambda_grpo_weights`).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> estimators.lambda_grpo_advantages(jnp.array([1.0, 0.0]), jnp.array([2, 6]),
    ...                                   group_size=2, lam=1.0, r=0.5).round(3)
    Array([ 0.467, -0.947], dtype=float32)
  """
  _checks.check_same_shape(rewards=rewards, lengths=lengths)
  advantages = grpo_advantages(rewards, group_size=group_size, eps=eps)
  return advantages * lambda_grpo_weights(lengths, group_size=group_size, lam=lam, r=r,
                                          h_min=h_min, eps=eps)
