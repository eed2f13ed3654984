"""The batch of one update of a batched run (`batched`): the cell's traceable task samples
and scores it, and the extras its arms' estimators read are computed in the same program.
The key streams of a run: ``fold_in(key(seed), STREAM)``."""

import jax
import jax.numpy as jnp

from jaxcredit import estimators, forward, tasks
from jaxcredit.credit import extras as extras_lib
from jaxcredit.credit import implicit_prm, length_preference, monte_carlo
from jaxcredit.lab import arms
from jaxcredit.lab.cells import Cell
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import Actions, generate, sample_tree

PROMPT_STREAM, SAMPLE_STREAM, EXTRAS_STREAM, NOISE_STREAM = 0, 1, 2, 3
WARMUP_STREAM, MECHANISM_STREAM, MC_STREAM = 4, 5, 6  # 7: the critic's (arms.CRITIC_STREAM)
ORACLE_STREAM, EVAL_STREAM = 8, 9  # a Monte-Carlo oracle's draws (zipf_explain)


def with_models(models: dict, batch: Rollout, actions: Actions,
                prm_beta: float | None = None, learn: bool = False) -> Rollout:
  """The batch with what its arms read from the run's other models.

  The critic's values V(s_t) (the learner step keeps them: `learner.prepare`); the
  reference's log-probs and the implicit PRM's, 0 off the mask; lambda-GRPO's length weights
  under the learnt preference. PRIME scores a batch with the PRM before that batch updates
  it: with `prm_beta` the PRM also takes that step here (`implicit_prm.update`, in place),
  whose pre-update log-probs are the batch's; with `learn` the length preference takes its
  step likewise (`length_preference.update`). Traceable.

  Args:
    models: the run's modules (`arms.modules`).
    batch: the sampled `Rollout`.
    actions: the task's action restrictions.
    prm_beta: PRIME's beta to update the PRM with, or None (no update).
    learn: whether the length preference takes this batch's step.

  Returns:
    the `Rollout` with values, ref_logprobs, extras["prm_logprobs"] and
    extras["length_weights"] where the models exist.
  """
  if "critic" in models:
    batch = batch.replace(values=forward.critic_values(models["critic"], batch, actions))
  if "prm" in models:
    logprobs = lambda model: jnp.where(
        batch.mask, forward.policy_outputs(model, batch, 1.0, actions).logprobs, 0.0)
    batch = batch.replace(ref_logprobs=logprobs(models["reference"]))
    if prm_beta is None:
      prm_logprobs = logprobs(models["prm"])
    else:
      _, prm_logprobs = implicit_prm.update(models["prm"], models["prm_optimizer"], batch,
                                            actions, prm_beta, 1.0)
    batch = batch.replace(extras={**batch.extras, "prm_logprobs": prm_logprobs})
  if "length_preference" in models:
    preference = models["length_preference"]
    weights = (length_preference.update(preference, models["length_preference_optimizer"],
                                        batch) if learn else
               length_preference.weights(preference, batch))
    batch = batch.replace(extras={**batch.extras, "length_weights": weights})
  return batch


def traceable_task(cell: Cell):
  """The traceable form of the cell's task.

  Args:
    cell: the batched `Cell`.

  Returns:
    its task's `tasks.Task.traceable` form, with the cell's evaluation prompts.
  """
  return tasks.of_options(cell.task).traceable(cell.task, cell.eval_prompts)


def make_rollout(cell: Cell, needs=frozenset(arms.EXTRAS)):
  """The batch sampler of one update of a cell (module docstring). Traceable.

  Args:
    cell: the batched `Cell`.
    needs: the extras to compute (`arms.EXTRAS` by default).

  Returns:
    ``rollout(model, key, oracle_extras=False, mc=arms.MonteCarlo()) -> Rollout``, with the
    extras in `needs` (all of them with oracle_extras; Monte-Carlo values as `mc` sets them,
    its fields may be traced, k = 0 for none).
  """
  task, group, config = traceable_task(cell), cell.group_size, cell.task
  actions, prompt_len = task.actions, config.prompt_length
  largest_k = max(arms.monte_carlo(estimators.from_config(arm)).k for arm in cell.arms)
  value_needs = {"oracle_advantages", "oracle_values", *estimators.registered_token.MC_VALUES}

  def rollout(model, key, oracle_extras=False, mc=arms.MonteCarlo()):
    prompts, targets = task.draw(jax.random.fold_in(key, PROMPT_STREAM), cell.prompts_per_step)
    settings = dict(max_new_tokens=config.length, actions=actions, stop_tokens=task.stop_tokens)
    sample_key, extras = jax.random.fold_in(key, SAMPLE_STREAM), {}
    if cell.tree is None:
      sample = generate(model, jnp.repeat(prompts, group, axis=0),
                        jnp.ones((prompts.shape[0] * group, prompt_len), bool), sample_key,
                        **settings)
    else:
      tree = sample_tree(model, prompts, jnp.ones(prompts.shape, bool), sample_key,
                         tree=cell.tree, **settings)
      sample, extras = tree.output, {"tree_path": tree.path, "tree_segments": tree.segments}
    targets = jnp.repeat(targets, group, axis=0)
    rewards = task.reward(sample.tokens, targets, jax.random.fold_in(key, NOISE_STREAM))
    mask = sample.mask
    if oracle_extras or needs & value_needs:
      tree = task.value_tree(model, prompts, targets[::group],
                             jax.random.fold_in(key, ORACLE_STREAM))
      values, credit = task.credit(tree, sample.tokens, targets, group)
      in_rows = lambda x: jnp.where(mask, jnp.pad(x, [(0, 0), (prompt_len, 0)]), 0.0)
      extras.update(oracle_values=in_rows(values), oracle_advantages=in_rows(credit))
    if largest_k and (oracle_extras or "mc_values" in needs):
      evaluated = monte_carlo.evaluated_positions(mask, sample.logprobs, mc.stride, mc.threshold)
      extras.update(mc_values=arms.monte_carlo_values(jax.random.fold_in(key, MC_STREAM),
                                                      extras["oracle_values"], evaluated, mc.k,
                                                      largest_k),
                    mc_evaluated=evaluated)
    # No KL term: the sampler's log-probs stand in for the reference's (no reference pass).
    batch = Rollout(tokens=sample.tokens, mask=mask, rewards=rewards,
                    behaviour_logprobs=sample.logprobs, ref_logprobs=sample.logprobs,
                    entropy=sample.entropy, truncated=sample.truncated,
                    positions=sample.positions, token_valid=sample.token_valid, extras=extras,
                    group_size=group)
    # The loop's own functions (`extras.register_traceable`) of the needed extras (all of
    # them with oracle_extras), each function once.
    wanted = [k for k in extras_lib.TRACEABLE.names() if oracle_extras or k in needs]
    for provide in dict.fromkeys(map(extras_lib.TRACEABLE.get, wanted)):
      batch = batch.replace(extras={**batch.extras, **provide(
          batch, jax.random.fold_in(key, EXTRAS_STREAM), task.vocab_size)})
    return batch

  return rollout
