"""Mixed token credit: GRPO's outcome advantage blended with PRIME's implicit
process reward, restricted to high-entropy (forking) tokens, trained with a
clip-higher PPO objective plus a scheduled entropy bonus and a k3 KL term.

The `advantage` and `objective` fields are read by
`jaxcredit.estimators.from_config` and `jaxcredit.losses.from_config`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Token advantage: 0.7 * GRPO + 0.3 * PRIME, kept on the top 20% entropy tokens.
  config.advantage = {
      "mask": "high_entropy",  # token selector from estimators.compose.SELECTORS
      "rho": 0.2,  # fraction of valid tokens kept, by entropy
      "of": {
          "sum": [
              {"weight": 0.7, "name": "grpo"},  # outcome credit, group-normalised
              {"weight": 0.3, "name": "prime", "beta": 0.05},  # implicit process reward
          ]
      },
  }
  # Objective: named terms, each a registered loss with a coefficient.
  config.objective = {
      "policy": {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28},  # DAPO clip-higher
      "kl": {"name": "kl", "coef": 0.01, "kind": "k3"},  # KL to the reference as a loss
      "entropy": {  # entropy bonus, linearly annealed to 0 over 1000 steps
          "name": "entropy",
          "coef": {"schedule": "linear_schedule", "init_value": 1e-3, "end_value": 0.0,
                   "transition_steps": 1000},
      },
  }
  return config
