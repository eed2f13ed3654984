"""PPO with a learned critic and GAE (Schulman et al., 2017) on the quickstart task.

The critic is a separate tiny Transformer with a scalar value head, regressed
to Monte-Carlo returns (critic.lam = 1) while the policy uses lambda = 0.95:
the decoupled lambda of VC-PPO (Yuan et al., 2025).
"""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.critic.preset = "tiny"  # separate parameters, same architecture, scalar head
  config.critic.learning_rate = (
    3e-4  # the critic starts from scratch, so it learns faster than the policy
  )
  config.critic.lam = 1.0  # value targets: Monte-Carlo returns
  config.advantage = {"name": "gae", "gamma": 1.0, "lam": 0.95}  # per-token credit from the critic
  config.objective = {"policy": {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2}}
  config.rl.epochs = 2  # two passes over each batch ...
  config.rl.minibatches = 2  # ... of two minibatches each: four updates per batch
  return config
