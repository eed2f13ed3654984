"""jaxcredit: how should an outcome reward be credited to the tokens that produced it?

Layers (imports point down): estimators and losses are pure functions of
arrays; `Rollout` is the batch they read.
"""

from jaxcredit import estimators, logprobs, losses
from jaxcredit.rollout import Estimate, PolicyOutputs, Rollout

__version__ = "0.1.0"
__all__ = ["Estimate", "PolicyOutputs", "Rollout", "estimators", "logprobs", "losses"]
