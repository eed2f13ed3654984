"""Policy, value, KL and preference losses; each returns (scalar loss, metrics).

`get(name)(outputs, rollout, estimate, **hparams) -> (loss, metrics)`.
"""

from jaxcredit.losses.aggregation import AGGREGATIONS, aggregate
from jaxcredit.losses.compose import (
    combine,
    entropy_term,
    from_config,
    kl_term,
    ppo_clip,
    term,
)
from jaxcredit.losses.covariance import clip_cov_loss, kl_cov_loss, token_covariance
from jaxcredit.losses.kl import KL_KINDS, kl_penalty, kl_reward_shaping
from jaxcredit.losses.off_policy import (
    behaviour_log_weight,
    m2_keep_mask,
    m2po_loss,
    masked_is_loss,
    opsm_loss,
    tis_loss,
    topr_loss,
)
from jaxcredit.losses.policy import cispo_loss, pg_loss, ppo_clip_loss, sapo_loss
from jaxcredit.losses.preference import dpo_loss, ipo_loss, simpo_loss
from jaxcredit.losses.sequence_ratio import gmpo_loss, gspo_loss, gspo_token_loss
from jaxcredit.losses.registered import (
    REGISTRY,
    get,
    names,
    register,
    sequence_advantages,
)
from jaxcredit.losses.trust_region import (
    decoupled_ppo_loss,
    dppo_loss,
    loglinear_proximal_logprobs,
    sat_loss,
)
from jaxcredit.losses.value import entropy_bonus, value_loss


__all__ = [
    "AGGREGATIONS",
    "KL_KINDS",
    "REGISTRY",
    "aggregate",
    "behaviour_log_weight",
    "cispo_loss",
    "clip_cov_loss",
    "combine",
    "decoupled_ppo_loss",
    "dpo_loss",
    "dppo_loss",
    "entropy_bonus",
    "entropy_term",
    "from_config",
    "get",
    "gmpo_loss",
    "gspo_loss",
    "gspo_token_loss",
    "ipo_loss",
    "kl_cov_loss",
    "kl_penalty",
    "kl_reward_shaping",
    "kl_term",
    "loglinear_proximal_logprobs",
    "m2_keep_mask",
    "m2po_loss",
    "masked_is_loss",
    "names",
    "opsm_loss",
    "pg_loss",
    "ppo_clip",
    "ppo_clip_loss",
    "register",
    "sapo_loss",
    "sat_loss",
    "sequence_advantages",
    "simpo_loss",
    "term",
    "tis_loss",
    "token_covariance",
    "topr_loss",
    "value_loss",
]
