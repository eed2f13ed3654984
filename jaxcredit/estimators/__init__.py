"""Advantage estimators: pure functions of arrays, and a registry of adapters.

`get(name)(rollout, **hparams) -> Estimate(advantages [B, T], returns | None)`.
"""

from jaxcredit.estimators.compose import (
    Component,
    component,
    components,
    from_config,
    masked,
    rms_scaled,
    reweighted,
    weighted_sum,
)
from jaxcredit.estimators.diagnostics import signal_diagnostics
from jaxcredit.estimators.group import (
    broadcast_to_tokens,
    gdpo_advantages,
    gpg_advantages,
    grpo_advantages,
    grpo_batch_std_advantages,
    outcome_to_tokens,
    remax_advantages,
    rloo_advantages,
)
from jaxcredit.estimators.group_objectives import maxrl_advantages, pass_at_k_advantages
from jaxcredit.estimators.length_aware import (
    lambda_grpo_advantages,
    lambda_grpo_weights,
    opo_advantages,
)
from jaxcredit.estimators.registered import (
    REGISTRY,
    get,
    names,
    register,
    token_level_rewards,
)
from jaxcredit.estimators import registered_token  # noqa: F401  (registers its estimators)
from jaxcredit.estimators.recurrence import METHODS as RECURRENCE_METHODS
from jaxcredit.estimators.returns import (
    discounted_returns,
    gae,
    lambda_returns,
    n_step_returns,
    vtrace,
)
from jaxcredit.estimators.token_credit import (
    high_entropy_mask,
    implicit_process_rewards,
    optimal_token_baseline_advantages,
    prm_token_rewards,
    surprisal_weights,
    whiten,
)
from jaxcredit.estimators.token_selectors import (
    groups_with_success,
    high_entropy_tokens,
    low_entropy_tokens,
    surprisal,
)
from jaxcredit.estimators.tree_credit import (
    spo_tree_advantages,
    tempo_advantages,
    tree_grpo_advantages,
    treepo_advantages,
    treerl_advantages,
)
from jaxcredit.estimators.tree_nodes import node_leaves, node_stats
from jaxcredit.estimators.turn_credit import (
    gigpo_advantages,
    mt_grpo_advantages,
    spread_over_turns,
    sum_to_starts,
    turn_baseline_advantages,
    turn_gae,
    turn_starts,
)
from jaxcredit.estimators.value_credit import (
    first_value,
    segment_advantages,
    segment_endpoints,
    sequence_advantages,
    values_to_advantages,
)

__all__ = [
    "node_leaves",
    "treerl_advantages",
    "treepo_advantages",
    "tree_grpo_advantages",
    "tempo_advantages",
    "spo_tree_advantages",
    "node_stats",
    "broadcast_to_tokens",
    "component",
    "Component",
    "components",
    "discounted_returns",
    "first_value",
    "from_config",
    "gae",
    "RECURRENCE_METHODS",
    "get",
    "gigpo_advantages",
    "gdpo_advantages",
    "gpg_advantages",
    "grpo_advantages",
    "grpo_batch_std_advantages",
    "maxrl_advantages",
    "groups_with_success",
    "high_entropy_mask",
    "high_entropy_tokens",
    "low_entropy_tokens",
    "implicit_process_rewards",
    "lambda_returns",
    "masked",
    "mt_grpo_advantages",
    "n_step_returns",
    "names",
    "lambda_grpo_advantages",
    "lambda_grpo_weights",
    "opo_advantages",
    "optimal_token_baseline_advantages",
    "outcome_to_tokens",
    "pass_at_k_advantages",
    "prm_token_rewards",
    "register",
    "REGISTRY",
    "remax_advantages",
    "reweighted",
    "rms_scaled",
    "rloo_advantages",
    "segment_advantages",
    "segment_endpoints",
    "sequence_advantages",
    "signal_diagnostics",
    "spread_over_turns",
    "sum_to_starts",
    "surprisal",
    "surprisal_weights",
    "token_level_rewards",
    "turn_baseline_advantages",
    "turn_gae",
    "turn_starts",
    "values_to_advantages",
    "vtrace",
    "weighted_sum",
    "whiten",
]
