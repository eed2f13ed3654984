"""Rollout sources: a batch of prompts in, a scored `Rollout` out.

  source(model, batch, key) -> Rollout

`batch` is what `jaxcredit.tasks.loader.Loader.rl_batch` yields: "prompts"
[B, P] left-padded ids, "prompt_valid" [B, P] bool and "examples" (the source
example of each row, for the reward), rows of a group contiguous. A source
samples from `model`, scores what it sampled and returns the `Rollout` the
learner reads. `SingleTurn` (one response per row, an outcome reward) is the
one the training loop uses for reasoning tasks; `MultiTurn` alternates turns
of the model with a `rollout_sources.environment.Environment`'s observations.
`PartialRollouts` carries a continuous `SingleTurn`'s unfinished responses across steps.
"""

from jaxcredit.rollout_sources.episodes import TurnTree
from jaxcredit.rollout_sources.multi_turn import MultiTurn
from jaxcredit.rollout_sources.partial import PartialRollouts
from jaxcredit.rollout_sources.single_turn import RolloutSource, Scorer, SingleTurn

__all__ = ["MultiTurn", "PartialRollouts", "RolloutSource", "Scorer", "SingleTurn", "TurnTree"]
