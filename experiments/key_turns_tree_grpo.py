"""Tree-GRPO on key_turns (key_turns_grpo's task and training): each prompt's 8 episodes are
the leaves of a tree whose nodes are whole turns - 2 episodes start from the prompt and,
after each of the first two turns, every episode is copied (its context's KV cache, its
environment state) into 2 - and each leaf's reward is normalised within its tree and
within the prompt's group (intra-tree plus inter-tree advantages)."""

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
  config.rl.steps = 100
  config.rollout.tree.fork = "turns"
  config.rollout.tree.roots = 2
  config.rollout.tree.branching = 2
  config.rollout.tree.depth = 2
  config.rollout.tree.segment_turns = 1  # forks after turns 0 and 1
  config.rl.group_size = 8  # the tree's leaves: 2 x 2^2
  config.advantage = {"name": "tree_grpo"}
  config.export.compare = ()
  return config
