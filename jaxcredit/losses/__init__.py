"""Policy, KL and preference losses; each returns (scalar loss, metrics).

`get(name)(outputs, rollout, estimate, **hparams) -> (loss, metrics)`.
"""

from jaxcredit.losses.aggregation import AGGREGATIONS, aggregate
from jaxcredit.losses.kl import KL_KINDS, kl_penalty
from jaxcredit.losses.policy import gspo_loss, ppo_clip_loss
from jaxcredit.losses.preference import dpo_loss
from jaxcredit.losses.registered import (
    REGISTRY,
    get,
    names,
    register,
    sequence_advantages,
)
from jaxcredit.rollout import Estimate, PolicyOutputs, Rollout

__all__ = [
    "AGGREGATIONS",
    "Estimate",
    "KL_KINDS",
    "PolicyOutputs",
    "REGISTRY",
    "Rollout",
    "aggregate",
    "dpo_loss",
    "get",
    "gspo_loss",
    "kl_penalty",
    "names",
    "ppo_clip_loss",
    "register",
    "sequence_advantages",
]
