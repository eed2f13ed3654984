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
from jaxcredit.estimators.returns import (
    GAE_METHODS,
    discounted_returns,
    gae,
    lambda_returns,
    n_step_returns,
    vtrace,
)
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
    "lambda_returns",
    "n_step_returns",
    "names",
    "outcome_to_tokens",
    "register",
    "rloo_advantages",
    "token_level_rewards",
    "vtrace",
]
