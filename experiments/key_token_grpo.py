"""GRPO on key_token: two decisive positions in 24 tokens,
filler hidden from the model, no SFT - the policy starts at chance (1/16)."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.task.name = "key_token"
  config.task.options = {
    "length": 24,  # T response tokens, all actions
    "n_decisive": 2,  # K decisive positions (spread: 8 and 16)
    "n_keys": 4,  # |C|: chance success 4^-2
    "n_fillers": 4,  # |F|
    "rule": "all",  # reward 1 iff every decisive token copies its key
    "filler_blind": True,  # filler never enters a later input
  }
  config.task.train_size = 4096
  config.task.test_size = 256
  config.sft.max_steps = 0  # RL from the random initial policy
  config.rl.learning_rate = 1e-3
  config.rl.steps = 200
  config.advantage = {"name": "grpo"}
  config.export.compare = ("oracle", "rloo")  # the exact credit beside GRPO's in the export
  return config
