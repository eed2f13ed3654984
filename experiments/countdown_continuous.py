"""GRPO on Countdown sampled by continuous batching (a quarter of the step's rows decoded at
once, a slot taking the next response as soon as its own ends), with room for long answers:
early in RL most responses end within 16 tokens while a few run on to the 64-token budget."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.task.name = "countdown"
  config.task.options = {"n_numbers": 3, "max_number": 20, "format_score": 0.1}
  config.task.max_prompt_length = 16  # BOS + "20,20,20>8000:" fits
  config.task.max_response_length = 64
  config.sft.noise = 0.2  # a fifth of the demonstrations carry one wrong token
  config.sft.target_accuracy = 0.15  # start RL from a weak solver
  config.advantage = {"name": "grpo"}
  config.rollout.engine = "continuous"
  return config
