"""lambda-GRPO with a learnt length preference on target_sum where length earns nothing
(S ~ U[1, 3]: one digit reaches it, zeros pad at no cost): each group's responses are
weighed G softmax(h^lam) by their standardised lengths, and lam, starting at 0 (every
response alike, token-mean), follows the gradient of the loss it weighs
(`lambda_grpo_learned`; train/hook/lambda_grpo/lam logs it)."""

from jaxcredit.train import base_config


def get_config():
  config = base_config.get_config()
  config.task.name = "target_sum"
  config.task.options = {"n_digits": 6, "n_values": 4, "target_low": 1, "target_high": 3,
                         "eos_allowed": True}
  config.task.train_size = 4096
  config.task.test_size = 256
  config.sft.max_steps = 0  # RL from the random initial policy
  config.rl.learning_rate = 1e-3
  config.rl.steps = 200
  config.advantage = {"name": "lambda_grpo_learned", "lam": 0.0, "r": 1.0,
                      "lam_learning_rate": 0.01}
  return config
