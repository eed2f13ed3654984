"""GRPO on target_sum: up to 6 digits in 0..3 that must sum to
S ~ U[3, 15], EOS allowed; a digit that overshoots, or leaves S out of reach, decides the
reward at once. No SFT: the policy starts from random digits and stops."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.task.name = "target_sum"
  config.task.options = {
    "n_digits": 6,  # n: at most 6 digits, then EOS (forced)
    "n_values": 4,  # m: digits 0..3
    "target_low": 3,  # S ~ U[3, 15]
    "target_high": 15,
    "eos_allowed": True,  # the policy may stop early
  }
  config.task.train_size = 4096
  config.task.test_size = 256
  config.sft.max_steps = 0  # RL from the random initial policy
  config.rl.learning_rate = 1e-3
  config.rl.steps = 200
  config.advantage = {"name": "grpo"}
  return config
