"""Advantage estimators: pure functions of arrays, and a registry of adapters.

`get(name)(rollout, **hparams) -> Estimate(advantages [B, T], returns | None)`.
"""

from jaxcredit.estimators.group import (
    broadcast_to_tokens,
    grpo_advantages,
    outcome_to_tokens,
    rloo_advantages,
)
from jaxcredit.estimators.registered import (
    REGISTRY,
    get,
    names,
    register,
    token_level_rewards,
)
from jaxcredit.estimators.returns import GAE_METHODS, discounted_returns, gae
from jaxcredit.rollout import Estimate, Rollout

__all__ = [
    "Estimate",
    "GAE_METHODS",
    "REGISTRY",
    "Rollout",
    "broadcast_to_tokens",
    "discounted_returns",
    "gae",
    "get",
    "grpo_advantages",
    "names",
    "outcome_to_tokens",
    "register",
    "rloo_advantages",
    "token_level_rewards",
]
