"""GRPO on key_turns episodes of 32,768 tokens, split along the `sequence` mesh axis: 64 turns,
each a 510-token observation (a key or filler, then SEP: a long tool output) and 2 action
tokens, the first and last turns decisive, filler actions hidden from later turns (so the exact
turn oracle, and the exact J the evaluation reports, stay exact). The learner's rows are
sharded 8 ways along `sequence` (mesh (1, 1, 8, 1)), and the sampler gives each of those devices
an episode of its own; the learner step's memory per device, from its compiled program, is
printed at the first step. On CPU, run it on 8 forced devices:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
    python -m jaxcredit.train --config experiments/key_turns_32k.py --workdir /tmp/key_turns_32k
"""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.task.name = "key_turns"
  config.task.options = {
    "n_turns": 64,
    "turn_length": 2,  # action tokens per turn
    "observation_length": 510,  # [key or FILL, FILL x 508, SEP]: 64 x 512 = 32,768 tokens
    "decisive": (0, 63),
    "n_keys": 3,
    "hidden_actions": True,
  }
  config.task.train_size = 1024
  config.task.test_size = 8
  config.sft.max_steps = 0
  config.mesh.shape = (1, 1, 8, 1)  # (data, fsdp, sequence, model)
  config.rl.prompts_per_step = 4  # x group_size 2: 8 episodes, 262,144 tokens per step
  config.rl.group_size = 2
  config.rl.learning_rate = 1e-3
  config.rl.steps = 4
  config.rl.eval_every = 4
  config.rl.report_memory = True
  config.advantage = {"name": "grpo"}
  config.export.compare = ()
  return config
