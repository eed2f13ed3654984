"""The tasks a batched study cell runs (`jaxcredit.lab.batched`), and what its runs need
from each, traceable: prompts drawn and for evaluation, rewards, exact values and credit.

  task = cell_tasks.task_of(cell.task, eval_prompts)   # KeyToken or TargetSum
  prompts, targets = task.draw(key, count)
  rewards = task.reward(tokens, targets, key)
  tree = task.value_tree(model, prompts, targets)      # the exact oracle's values
  values, credit = task.credit(tree, tokens, targets, group)
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit.lab import oracle, sum_tree, tree_oracle
from jaxcredit.sampling import Actions
from jaxcredit.tasks import key_token, target_sum
from jaxcredit.train import tasks

TaskConfig = key_token.KeyTokenConfig | target_sum.TargetSumConfig


def prompts_of(symbols, config: key_token.KeyTokenConfig):
  """([..., K + 2] prompt ids, [..., K] target key ids) of key symbols [..., K] (indices
  into C), as `key_token.make_example` lays them out. Traceable."""
  symbols = jnp.asarray(symbols, jnp.int32)
  targets = symbols if config.key_fn == "copy" else (
      symbols + jnp.arange(1, config.n_decisive + 1)) % config.n_keys
  ends = lambda token: jnp.full(symbols.shape[:-1] + (1,), token, jnp.int32)
  prompts = jnp.concatenate([ends(key_token.BOS), key_token.KEY0 + symbols, ends(key_token.SEP)],
                            axis=-1)
  return prompts, key_token.KEY0 + targets


def evaluation_symbols(config: key_token.KeyTokenConfig, limit: int) -> np.ndarray:
  """[n, K] key symbols of the evaluation prompts: all |C|^K when that is at most `limit`,
  else `limit` drawn uniformly (a fixed stream, the same for every seed and cell)."""
  if config.n_keys**config.n_decisive <= limit:
    return np.asarray(list(itertools.product(range(config.n_keys), repeat=config.n_decisive)))
  return np.random.default_rng(0).integers(0, config.n_keys, (limit, config.n_decisive))




class KeyToken:
  """What a cell's runs need from key_token (traceable): prompts, rewards, exact values."""

  config_type, vocab_size = key_token.KeyTokenConfig, key_token.VOCAB_SIZE

  def __init__(self, config: key_token.KeyTokenConfig, eval_prompts: int):
    self.config, self.actions, self.stop_tokens = config, tasks.key_token_actions(config), ()
    self.decisive = config.prompt_length + config.decisive_positions
    self.eval_prompts = prompts_of(evaluation_symbols(config, eval_prompts), config)

  def draw(self, key, count: int):
    """(prompts [count, P], targets) drawn uniformly."""
    config = self.config
    return prompts_of(jax.random.randint(key, (count, config.n_decisive), 0, config.n_keys),
                      config)

  def reward(self, tokens, targets, key):
    rewards = key_token.rule_reward(tokens[:, self.decisive], targets, self.config)
    if self.config.noise:
      flip = jax.random.uniform(key, rewards.shape) < self.config.noise
      rewards = jnp.where(flip, 1.0 - rewards, rewards)
    return rewards

  def value_tree(self, model, prompts, targets):
    """Each prompt's exact value tree: E-DEC with filler hidden, else E-TREE."""
    if self.config.filler_blind:
      return oracle.decisive_values(model, self.config, prompts, targets)
    return tree_oracle.value_tree(model, self.config, prompts, targets)

  def success(self, tree):
    return tree[0][:, 0] if self.config.filler_blind else tree[0]

  def credit(self, tree, tokens, targets, group: int):
    """(values, advantages) [B, T] of the response columns of `tokens` [B, P + T]."""
    config = self.config
    if config.filler_blind:
      return oracle.credit_from_values([jnp.repeat(w, group, axis=0) for w in tree],
                                       tokens[:, self.decisive], config)
    return tree_oracle.credit_from_tree(tree, jnp.arange(tokens.shape[0]) // group,
                                        tokens[:, config.prompt_length:], targets, config)


class TargetSum:
  """What a cell's runs need from target_sum (as `KeyToken`): E-TREE (`sum_tree`)."""

  config_type, vocab_size = target_sum.TargetSumConfig, target_sum.VOCAB_SIZE

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
    return sum_tree.response_outcome(tokens[:, self.config.prompt_length:], targets,
                                     self.config)

  def value_tree(self, model, prompts, targets):
    return sum_tree.value_tree(model, self.config, prompts, targets)

  def success(self, tree):
    return tree[0][:, 0]

  def credit(self, tree, tokens, targets, group: int):
    return sum_tree.credit_from_tree(tree, jnp.arange(tokens.shape[0]) // group,
                                     tokens[:, self.config.prompt_length:], targets, self.config)


# The tasks a cell can run, by name: each class's config_type is its cell.task's type.
TASKS = {"key_token": KeyToken, "target_sum": TargetSum}


def task_of(config: TaskConfig, eval_prompts: int) -> "KeyToken | TargetSum":
  """The task of a cell's `config`, evaluated on at most `eval_prompts` prompts."""
  task = next(t for t in TASKS.values() if isinstance(config, t.config_type))
  return task(config, eval_prompts)
