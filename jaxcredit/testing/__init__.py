"""Conformance kit: check your own estimators and losses the way jaxcredit
checks its built-ins.

  from jaxcredit import testing
  testing.check_estimator(my_estimator, invariances=[testing.group_reward_shift()])
  testing.check_loss(my_loss)
  @hypothesis.given(testing.strategies.rollouts())
  def test_mine(rollout): ...
"""

from jaxcredit.testing import strategies
from jaxcredit.testing.conformance import (
    ConformanceError,
    check_estimator,
    check_loss,
    degenerate_rollouts,
    describe,
    group_reward_shift,
    reward_scale,
    poison_masked,
)

__all__ = [
    "ConformanceError",
    "check_estimator",
    "check_loss",
    "degenerate_rollouts",
    "describe",
    "group_reward_shift",
    "reward_scale",
    "poison_masked",
    "strategies",
]
