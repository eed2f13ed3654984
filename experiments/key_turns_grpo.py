"""GRPO on key_turns: four one-token turns, the environment reveals a key before
turns 1 and 3 and the episode pays 1 iff both copy it; no SFT, so the policy starts
near chance (1/32 per decisive turn)."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.task.name = "key_turns"
  config.task.options = {
    "n_turns": 4,  # turns per episode (one token each)
    "decisive": (1, 3),  # turns whose token must copy the key shown just before
    "n_keys": 3,  # keys drawn per decisive turn
  }
  config.task.train_size = 4096
  config.task.test_size = 256
  config.sft.max_steps = 0  # multi-turn: RL from the random initial policy
  config.rl.learning_rate = 1e-3
  config.rl.steps = 100  # sampled reward goes from ~0.001 to ~0.99 in about 60 steps
  config.advantage = {"name": "grpo"}
  config.export.compare = ()
  return config
