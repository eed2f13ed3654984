"""REINFORCE++ (Hu, 2025) on the quickstart task: batch-whitened returns of the
outcome reward plus a per-token KL-to-reference reward penalty."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.advantage = {
    "name": "reinforce_pp"
  }  # whitened returns of outcome + KL-penalty token rewards
  config.rl.kl_reward_coef = 0.01  # KL to the post-SFT reference as a per-token reward penalty ...
  config.rl.kl_reward_kind = "k1"  # ... with the k1 estimator log pi - log pi_ref
  config.objective = {
    "policy": {"name": "ppo_clip"},  # clip 0.2 both sides
    "kl": {
      "name": "kl",
      "coef": 0.01,
      "kind": "k3",
    },  # and as a k3 loss term (GRPO-style); either can be 0
  }
  return config
