"""GRPO on calculator (a tool-use task): the policy calls a calculator (`C47*38+215;`),
reads its result (`=2001;`) and answers (`A2001;`), after a noisy SFT warm start on
demonstration episodes (trained on the policy's turns, not the tool's replies)."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.task.name = "calculator"
  config.task.options = {
    "n_operands": 3,  # a op b op c, op in + *
    "min_digits": 2,
    "max_digits": 3,
    "max_turns": 3,  # tool calls and the answer share this budget
    "max_turn_tokens": 16,  # characters per turn, ";" included
  }
  config.task.max_prompt_length = 14  # BOS + "999*999*999=" fits
  config.sft.noise = 0.2  # a fifth of the demonstrations carry one wrong character
  config.sft.target_accuracy = 0.3  # start RL from a weak tool user
  config.advantage = {"name": "grpo"}
  config.export.compare = ()
  return config
