"""The tasks a batched study cell runs (`jaxcredit.lab.batched`), and what its runs need
from each, traceable: prompts drawn and for evaluation, rewards, exact values and credit.

  task = cell_tasks.task_of(cell.task, eval_prompts)   # KeyToken, TargetSum, ZipfExplain
  prompts, targets = task.draw(key, count)
  rewards = task.reward(tokens, targets, key)
  tree = task.value_tree(model, prompts, targets, key)  # the oracle's values
  values, credit = task.credit(tree, tokens, targets, group)
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit.lab import explain_oracle, oracle, sum_tree, tree_oracle
from jaxcredit.sampling import Actions
from jaxcredit.tasks import key_token, target_sum, zipf_explain

TaskConfig = (key_token.KeyTokenConfig | target_sum.TargetSumConfig
              | zipf_explain.ZipfExplainConfig)


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


def evaluation_symbols(n_keys: int, count: int, limit: int) -> np.ndarray:
  """[n, count] key symbols (indices into C, |C| = n_keys) of the evaluation prompts: all
  |C|^count when that is at most `limit`, else `limit` drawn uniformly (a fixed stream, the
  same for every seed and cell)."""
  if n_keys**count <= limit:
    return np.asarray(list(itertools.product(range(n_keys), repeat=count)))
  return np.random.default_rng(0).integers(0, n_keys, (limit, count))


class KeyToken:
  """What a cell's runs need from key_token (traceable): prompts, rewards, exact values."""

  config_type, vocab_size = key_token.KeyTokenConfig, key_token.VOCAB_SIZE

  def __init__(self, config: key_token.KeyTokenConfig, eval_prompts: int):
    self.config, self.actions, self.stop_tokens = config, key_token.row_actions(config), ()
    self.decisive = config.prompt_length + config.decisive_positions
    self.eval_prompts = prompts_of(
        evaluation_symbols(config.n_keys, config.n_decisive, eval_prompts), config)

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
    """[count, T] SFT responses (`batched.Warmup`): filler from warmup.filler_probs, the
    right key at each decisive position with probability warmup.key_accuracy, else a
    uniform key; and their prompts [count, P]."""
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

  def value_tree(self, model, prompts, targets, key=None):
    del key  # exact
    return sum_tree.value_tree(model, self.config, prompts, targets)

  def success(self, tree):
    return tree[0][:, 0]

  def credit(self, tree, tokens, targets, group: int):
    return sum_tree.credit_from_tree(tree, jnp.arange(tokens.shape[0]) // group,
                                     tokens[:, self.config.prompt_length:], targets, self.config)


class ZipfExplain:
  """What a cell's runs need from zipf_explain (as `KeyToken`). No exact oracle: its values
  are the Rao-Blackwellised Monte-Carlo oracle's (`explain_oracle`). J(pi) is estimated at
  each evaluation prompt from EVAL_PATHS continuations; the token credit from CREDIT_PATHS
  continuations of each response's states at its cuts (every CUT_STRIDE columns and around
  its MARKs: `explain_oracle.cuts_of`), spread over the tokens between two cuts."""

  config_type, vocab_size = zipf_explain.ZipfExplainConfig, zipf_explain.VOCAB_SIZE
  EVAL_PATHS, CREDIT_PATHS, CUT_STRIDE = 32, 4, 16

  def __init__(self, config: zipf_explain.ZipfExplainConfig, eval_prompts: int):
    self.config, self.stop_tokens = config, ()
    self.actions = Actions(allowed=zipf_explain.allowed_in_rows(config))
    symbols = jnp.asarray(evaluation_symbols(config.n_keys, config.n_answers, eval_prompts))
    self.eval_prompts = zipf_explain.prompts(symbols, config), symbols

  def draw(self, key, count: int):
    config = self.config
    targets = jax.random.randint(key, (count, config.n_answers), 0, config.n_keys)
    return zipf_explain.prompts(targets, config), targets

  def reward(self, tokens, targets, key):
    del key
    return zipf_explain.outcome(tokens[:, self.config.prompt_length:], targets, self.config)

  def demonstrations(self, key, warmup, count: int):
    """[count, T] SFT responses: the grammar's text with K answers, each right with
    probability warmup.key_accuracy (`zipf_explain.demonstrations`); and their prompts."""
    prompts, targets = self.draw(jax.random.fold_in(key, 0), count)
    return prompts, zipf_explain.demonstrations(jax.random.fold_in(key, 1), targets,
                                                self.config, warmup.key_accuracy)

  def value_tree(self, model, prompts, targets, key):
    """No tree: what the oracle's continuations need (the policy, the prompts, a key)."""
    return model, prompts, targets, key

  def success(self, tree):
    model, prompts, targets, key = tree
    rows = jnp.pad(prompts, [(0, 0), (0, self.config.length)])  # s_0: no response yet
    values, _ = explain_oracle.rb_values(model, rows, targets, jnp.zeros(1, jnp.int32), key,
                                         self.config, n_paths=self.EVAL_PATHS)
    return values[:, 0]

  def credit(self, tree, tokens, targets, group: int):
    del group  # each response's states are its own
    model, _, _, key = tree
    config = self.config
    cuts = explain_oracle.cuts_of(tokens[:, config.prompt_length:], config, self.CUT_STRIDE)
    values, _ = explain_oracle.rb_values(model, tokens, targets, cuts, key, config,
                                         n_paths=self.CREDIT_PATHS)
    return explain_oracle.credit_from_cuts(values, cuts, config.length)


# The tasks a cell can run, by name: each class's config_type is its cell.task's type.
TASKS = {"key_token": KeyToken, "target_sum": TargetSum, "zipf_explain": ZipfExplain}


def task_of(config: TaskConfig, eval_prompts: int) -> "KeyToken | TargetSum | ZipfExplain":
  """The task of a cell's `config`, evaluated on at most `eval_prompts` prompts."""
  task = next(t for t in TASKS.values() if isinstance(config, t.config_type))
  return task(config, eval_prompts)
