"""Token selectors and token weights: what `compose.masked` keeps and `compose.reweighted`
multiplies an advantage by, token by token (the ``"mask"`` and ``"reweight"`` forms of
`compose.from_config`, by the names of `SELECTORS` and `WEIGHTS`).
"""

from collections.abc import Callable

import jax.numpy as jnp
from jax import Array

from jaxcredit._masking import as_bool
from jaxcredit.estimators import token_credit
from jaxcredit.rollout import Rollout

TokenFn = Callable[[Rollout], Array]


def high_entropy_tokens(*, rho: float = 0.2) -> TokenFn:
  """Token selector: the top-`rho` valid tokens by ``rollout.entropy``.

  Args:
    rho: the fraction of valid tokens kept, in ``(0, 1]``.

  Returns:
    ``select(rollout) -> [B, T]`` bool (see `token_credit.high_entropy_mask`); raises
    ValueError when the rollout has no entropy.

  References:
    Wang et al., 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
    Reinforcement Learning for LLM Reasoning", arXiv 2506.01939.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo
    >>> from jaxcredit.estimators import token_selectors
    >>> rollout = demo.sample_rollout()
    >>> rollout = rollout.replace(entropy=jnp.arange(64.0).reshape(8, 8))
    >>> selected = token_selectors.high_entropy_tokens(rho=0.25)(rollout)
    >>> int(selected.sum()), int(rollout.mask.sum())
    (8, 31)
  """

  def select(rollout: Rollout) -> Array:
    rollout.require("entropy", by="high_entropy_tokens")
    return token_credit.high_entropy_mask(rollout.entropy, rollout.mask, rho=rho)

  return select


def low_entropy_tokens(*, rho: float = 0.2) -> TokenFn:
  """Token selector: the valid tokens outside the top-`rho` by ``rollout.entropy``.

  The bottom ``1 - rho``: the control of `high_entropy_tokens` in the 80/20 ablation.

  Args:
    rho: the fraction of valid tokens left out, in ``(0, 1]``.

  Returns:
    ``select(rollout) -> [B, T]`` bool; raises ValueError when the rollout has no entropy.

  References:
    Wang et al., 2025, "Beyond the 80/20 Rule", arXiv 2506.01939.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo
    >>> from jaxcredit.estimators import token_selectors
    >>> rollout = demo.sample_rollout()
    >>> rollout = rollout.replace(entropy=jnp.arange(64.0).reshape(8, 8))
    >>> high = token_selectors.high_entropy_tokens(rho=0.25)(rollout)
    >>> low = token_selectors.low_entropy_tokens(rho=0.25)(rollout)
    >>> bool(jnp.all((high ^ low) == rollout.mask))  # the two split the valid tokens
    True
  """

  def select(rollout: Rollout) -> Array:
    rollout.require("entropy", by="low_entropy_tokens")
    top = token_credit.high_entropy_mask(rollout.entropy, rollout.mask, rho=rho)
    return as_bool(rollout.mask) & ~as_bool(top)

  return select


def groups_with_success(*, threshold: float = 0.0) -> TokenFn:
  """Token selector: the valid tokens of the groups in which some response's reward exceeds
  `threshold`.

  Drops the groups where every response failed: under a 0/1 reward they give a group
  baseline no signal, while a baseline from outside the group (a learned or exact value)
  still credits their tokens. Masking them separates what an estimator learns from failed
  groups from the rest of its credit.

  Args:
    threshold: a response succeeds when its reward is above it.

  Returns:
    ``select(rollout) -> [B, T]`` bool.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo
    >>> from jaxcredit.estimators import token_selectors
    >>> rollout = demo.sample_rollout()  # 2 groups of 4
    >>> rollout = rollout.replace(rewards=jnp.array([0.0, 0, 0, 0, 0, 1, 0, 0]))
    >>> token_selectors.groups_with_success()(rollout).any(axis=1).tolist()
    [False, False, False, False, True, True, True, True]
  """

  def select(rollout: Rollout) -> Array:
    succeeded = (rollout.rewards > threshold).reshape(-1, rollout.group_size)
    kept = jnp.repeat(jnp.any(succeeded, axis=1), rollout.group_size)
    return as_bool(rollout.mask) & kept[:, None]

  return select


def surprisal(rollout: Rollout) -> Array:
  """Token weights: the surprisal of ``rollout.behaviour_logprobs``, mean 1 over valid tokens.

  Args:
    rollout: a `Rollout` with behaviour log-probs.

  Returns:
    float32 ``[B, T]`` (see `token_credit.surprisal_weights`).

  Raises:
    ValueError: when the rollout has no behaviour log-probs.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo
    >>> from jaxcredit.estimators import token_selectors
    >>> rollout = demo.sample_rollout()
    >>> rollout = rollout.replace(behaviour_logprobs=jnp.full((8, 8), -1.0))
    >>> float(token_selectors.surprisal(rollout).max())  # equal surprisal: weight 1
    1.0
  """
  rollout.require("behaviour_logprobs", by="surprisal")
  return token_credit.surprisal_weights(rollout.behaviour_logprobs, rollout.mask)


SELECTORS: dict[str, Callable[..., TokenFn]] = {"high_entropy": high_entropy_tokens,
                                                "low_entropy": low_entropy_tokens,
                                                "groups_with_success": groups_with_success}
WEIGHTS: dict[str, TokenFn] = {"surprisal": surprisal}
