"""GRPO on 256-turn key_turns: two decisive turns, the first and the last, among 254 filler
turns whose actions are hidden from later turns (so the exact turn oracle, and the exact J
the evaluation reports, stay exact); no SFT, so the policy starts near chance (1/32 per
decisive turn). An episode is 768 tokens: 256 observations [key or FILL, SEP] and 256
one-token actions."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.task.name = "key_turns"
  config.task.options = {
    "n_turns": 256,  # turns per episode (one token each)
    "decisive": (0, 255),  # key_turns.decisive_turns(256, 2, "spread")
    "n_keys": 3,  # keys drawn per decisive turn
    "hidden_actions": True,  # filler actions are fed to later turns as FILL
  }
  config.task.train_size = 4096
  config.task.test_size = 256
  config.sft.max_steps = 0  # multi-turn: RL from the random initial policy
  config.rl.prompts_per_step = 8  # x group_size 8: 64 episodes, 49,152 tokens per step
  config.rl.learning_rate = 1e-3
  config.rl.steps = 100
  config.rl.eval_every = 10
  config.advantage = {"name": "grpo"}
  config.export.compare = ()
  return config
