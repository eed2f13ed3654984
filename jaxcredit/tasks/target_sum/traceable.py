"""target_sum's traceable form for the batched credit lab (`jaxcredit.lab.batched`): every
function here runs inside the lab's jit and vmap over seeds (as key_token's `traceable`).
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit.sampling import Actions
from jaxcredit.tasks.target_sum import definition as target_sum
from jaxcredit.tasks.target_sum import oracle


class Traceable:
  """What a batched cell's runs need from target_sum, traceable (as key_token's `Traceable`);
  its values are E-TREE's (`oracle.value_tree`).

  Args:
    config: the task's `TargetSumConfig`.
    eval_prompts: the most evaluation prompts.
  """

  vocab_size = target_sum.VOCAB_SIZE

  def __init__(self, config: target_sum.TargetSumConfig, eval_prompts: int):
    self.config, self.stop_tokens = config, (target_sum.EOS,)
    self.actions = Actions(allowed=target_sum.allowed_in_rows(config))
    sums = np.arange(config.target_low, config.target_high + 1)
    if len(sums) > eval_prompts:
      sums = np.random.default_rng(0).choice(sums, eval_prompts, replace=False)
    sums = jnp.asarray(sums, jnp.int32)
    self.eval_prompts = target_sum.prompts(sums, config), sums

  def draw(self, key, count: int):
    config = self.config
    sums = jax.random.randint(key, (count,), config.target_low, config.target_high + 1)
    return target_sum.prompts(sums, config), sums

  def reward(self, tokens, targets, key):
    del key
    return oracle.response_outcome(tokens[:, self.config.prompt_length:], targets, self.config)

  def value_tree(self, model, prompts, targets, key=None):
    del key  # exact
    return oracle.value_tree(model, self.config, prompts, targets)

  def success(self, tree):
    return tree[0][:, 0]

  def credit(self, tree, tokens, targets, group: int):
    return oracle.credit_from_tree(tree, jnp.arange(tokens.shape[0]) // group,
                                   tokens[:, self.config.prompt_length:], targets, self.config)
