"""TreePO on key_token (key_token_grpo's task and training): each prompt's 8 responses are the
leaves of a sampled tree, 2 chains each forking twice into 2, whose segments start at the
decisive positions 8 and 16 - leaves that share their first decisive choice form a subgroup
that compares the second alone. The shared segments are sampled once (train/gen_tokens)."""

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
  config.rollout.tree.fork = "fixed"
  config.rollout.tree.roots = 2
  config.rollout.tree.branching = 2
  config.rollout.tree.depth = 2
  config.rollout.tree.segment_tokens = 8  # segments [0, 8), [8, 16), [16, 24)
  config.rl.group_size = 8  # the tree's leaves: 2 x 2^2
  config.advantage = {"name": "treepo"}
  config.export.compare = ("oracle", "grpo")  # the exact credit beside TreePO's in the export
  return config
