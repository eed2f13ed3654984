"""GRPO on Countdown with three numbers (the TinyZero task), after a noisy SFT warm start."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.task.name = "countdown"
  config.task.options = {
    "n_numbers": 3,
    "max_number": 20,
    "format_score": 0.1,
  }  # right numbers, wrong value: 0.1
  config.task.max_prompt_length = 16  # BOS + "20,20,20>8000:" fits
  config.task.max_response_length = 16  # "(20+20)*20" + EOS, plus slack
  config.sft.noise = 0.2  # a fifth of the demonstrations carry one wrong token
  config.sft.target_accuracy = 0.15  # start RL from a weak solver
  config.advantage = {"name": "grpo"}
  return config
