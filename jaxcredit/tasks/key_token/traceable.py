"""key_token's traceable form for the batched credit lab (`jaxcredit.lab.batched`): every
function here runs inside the lab's jit and vmap over seeds.

  task = Traceable(options, eval_prompts)
  prompts, targets = task.draw(key, count)
  rewards = task.reward(tokens, targets, key)
  tree = task.value_tree(model, prompts, targets, key)   # the exact oracle's values
  values, credit = task.credit(tree, tokens, targets, group)
"""

import jax
import jax.numpy as jnp

from jaxcredit.tasks import procedural
from jaxcredit.tasks.key_token import definition as key_token
from jaxcredit.tasks.key_token import oracle


def prompts_of(symbols, config: key_token.KeyTokenConfig):
  """Prompts and target keys of key symbols, as `key_token.make_example` lays them out.
  Traceable.

  Args:
    symbols: ``[..., K]`` indices into C.
    config: the task's `KeyTokenConfig`.

  Returns:
    ``(prompts [..., K + 2] ids, targets [..., K] key ids)``.
  """
  symbols = jnp.asarray(symbols, jnp.int32)
  targets = symbols if config.key_fn == "copy" else (
      symbols + jnp.arange(1, config.n_decisive + 1)) % config.n_keys
  ends = lambda token: jnp.full(symbols.shape[:-1] + (1,), token, jnp.int32)
  prompts = jnp.concatenate([ends(key_token.BOS), key_token.KEY0 + symbols, ends(key_token.SEP)],
                            axis=-1)
  return prompts, key_token.KEY0 + targets


class Traceable:
  """What a batched cell's runs need from key_token, traceable: prompts drawn and for
  evaluation, rewards, SFT demonstrations, exact values and credit.

  Args:
    config: the task's `KeyTokenConfig`.
    eval_prompts: the most evaluation prompts (`procedural.evaluation_symbols`).
  """

  vocab_size = key_token.VOCAB_SIZE

  def __init__(self, config: key_token.KeyTokenConfig, eval_prompts: int):
    self.config, self.actions, self.stop_tokens = config, key_token.row_actions(config), ()
    self.decisive = config.prompt_length + config.decisive_positions
    self.eval_prompts = prompts_of(
        procedural.evaluation_symbols(config.n_keys, config.n_decisive, eval_prompts), config)

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

  def demonstrations(self, key, warmup, count: int):
    """[count, T] SFT responses (`jaxcredit.lab.cells.Warmup`): filler from
    warmup.filler_probs, the right key at each decisive position with probability
    warmup.key_accuracy, else a uniform key; and their prompts [count, P]."""
    config = self.config
    keys = jax.random.split(key, 4)
    prompts, targets = prompts_of(
        jax.random.randint(keys[0], (count, config.n_decisive), 0, config.n_keys), config)
    filler = jnp.asarray(config.fillers)[jax.random.categorical(
        keys[1], jnp.log(jnp.asarray(warmup.filler_probs)), shape=(count, config.length))]
    guess = key_token.KEY0 + jax.random.randint(keys[2], targets.shape, 0, config.n_keys)
    right = jax.random.uniform(keys[3], targets.shape) < warmup.key_accuracy
    return prompts, filler.at[:, config.decisive_positions].set(jnp.where(right, targets, guess))

  def value_tree(self, model, prompts, targets, key=None):
    """Each prompt's exact value tree: E-DEC with filler hidden, else E-TREE (exact: no
    draws from `key`)."""
    if self.config.filler_blind:
      return oracle.decisive_values(model, self.config, prompts, targets)
    return oracle.value_tree(model, self.config, prompts, targets)

  def success(self, tree):
    return tree[0][:, 0] if self.config.filler_blind else tree[0]

  def credit(self, tree, tokens, targets, group: int):
    """(values, advantages) [B, T] of the response columns of `tokens` [B, P + T]."""
    config = self.config
    if config.filler_blind:
      return oracle.credit_from_values([jnp.repeat(w, group, axis=0) for w in tree],
                                       tokens[:, self.decisive], config)
    return oracle.credit_from_tree(tree, jnp.arange(tokens.shape[0]) // group,
                                   tokens[:, config.prompt_length:], targets, config)
