"""zipf_explain's traceable form for the batched credit lab (`jaxcredit.lab.batched`): every
function here runs inside the lab's jit and vmap over seeds (as key_token's `traceable`).
"""

import jax
import jax.numpy as jnp

from jaxcredit.sampling import Actions
from jaxcredit.tasks import procedural
from jaxcredit.tasks.zipf_explain import definition as zipf_explain
from jaxcredit.tasks.zipf_explain import oracle


class Traceable:
  """What a batched cell's runs need from zipf_explain (as key_token's `Traceable`).

  No exact oracle: its values are the Rao-Blackwellised Monte-Carlo oracle's (`oracle`).
  J(pi) is estimated at each evaluation prompt from EVAL_PATHS continuations; the token
  credit from CREDIT_PATHS continuations of each response's states at its cuts (every
  CUT_STRIDE columns and around its MARKs: `oracle.cuts_of`), spread over the tokens between
  two cuts.

  Args:
    config: the task's `ZipfExplainConfig`.
    eval_prompts: the most evaluation prompts.
  """

  vocab_size = zipf_explain.VOCAB_SIZE
  EVAL_PATHS, CREDIT_PATHS, CUT_STRIDE = 32, 4, 16

  def __init__(self, config: zipf_explain.ZipfExplainConfig, eval_prompts: int):
    self.config, self.stop_tokens = config, ()
    self.actions = Actions(allowed=zipf_explain.allowed_in_rows(config))
    symbols = jnp.asarray(procedural.evaluation_symbols(config.n_keys, config.n_answers,
                                                        eval_prompts))
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
    values, _ = oracle.rb_values(model, rows, targets, jnp.zeros(1, jnp.int32), key,
                                         self.config, n_paths=self.EVAL_PATHS)
    return values[:, 0]

  def credit(self, tree, tokens, targets, group: int):
    del group  # each response's states are its own
    model, _, _, key = tree
    config = self.config
    cuts = oracle.cuts_of(tokens[:, config.prompt_length:], config, self.CUT_STRIDE)
    values, _ = oracle.rb_values(model, tokens, targets, cuts, key, config,
                                         n_paths=self.CREDIT_PATHS)
    return oracle.credit_from_cuts(values, cuts, config.length)
