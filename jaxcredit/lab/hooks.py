"""Rollout hooks that give model- or rollout-based estimators their inputs
inside the training loop (`jaxcredit.train.loop.run(..., rollout_hook=...)`).

  vineppo, spo       K Monte-Carlo continuations per evaluated position ->
                     extras["mc_values"], extras["mc_evaluated"] (charged to gen_tokens)
  oracle, oracle_seq exact credit on filler-blind key_token ->
                     extras["oracle_advantages"], extras["oracle_values"] (not charged:
                     the oracle is an upper bound on information, LAB.md 4.3)
  ktae               per-group key-token scores -> extras["ktae_scores"]
  prime              an implicit PRM (a copy of the policy at the first RL step,
                     trained on outcome labels) -> extras["prm_logprobs"]
"""

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxcredit.lab import oracle, token_statistics
from jaxcredit.train import steps, tasks
from jaxcredit.train.loop import RolloutHook

MC_POSITIONS = {"vineppo": "all", "spo": "cutpoints:0.9"}  # default evaluation points
ORACLE_ESTIMATORS = ("oracle", "oracle_seq")


class ImplicitPRM:
  """PRIME's implicit process reward model (Cui et al., 2025, arXiv 2502.01456;
  recipe prime_dp_rm.py): pi_phi starts as the policy at the first RL step and
  after scoring each batch takes one Adam step on
  BCE(sigmoid(beta sum_t (log pi_phi - log pi_ref)), R), with pi_ref the
  loop's frozen reference. Its state lives in this object (not checkpointed:
  a resumed run restarts phi from the current policy)."""

  def __init__(self, *, beta: float = 0.05, learning_rate: float = 1e-4, temperature: float = 1.0):
    self.beta, self.learning_rate, self.temperature = beta, learning_rate, temperature
    self.prm = self.optimizer = None

  def __call__(self, task, model, rollout) -> tuple[dict, dict]:
    actions = tasks.actions(task)
    if self.prm is None:
      self.prm = nnx.clone(model)
      self.optimizer = nnx.Optimizer(self.prm, optax.adam(self.learning_rate), wrt=nnx.Param)
    loss, logprobs = _prm_step(self.prm, self.optimizer, rollout, actions, self.beta, self.temperature)
    return {"prm_logprobs": logprobs}, {"prm_loss": float(loss)}


@nnx.jit(static_argnums=(4, 5))
def _prm_step(prm, optimizer, rollout, actions, beta: float, temperature: float):
  """(BCE loss, the pre-update PRM log-probs) and one Adam step of the PRM."""

  def loss_fn(prm):
    logprobs = steps.policy_outputs(prm, rollout, temperature, actions).logprobs
    valid = rollout.mask
    score = beta * jnp.sum(jnp.where(valid, logprobs - rollout.ref_logprobs, 0.0), axis=1)
    labels = rollout.rewards
    loss = jnp.mean(optax.sigmoid_binary_cross_entropy(score, labels))
    return loss, jnp.where(valid, logprobs, 0.0)

  (loss, logprobs), grads = nnx.value_and_grad(loss_fn, has_aux=True)(prm)
  optimizer.update(prm, grads)
  return loss, logprobs


def estimator_settings(config: str | Mapping[str, Any]) -> dict[str, dict]:
  """{name: hyperparameters} of every estimator in a (nested) advantage config."""
  if isinstance(config, str):
    return {config: {}}
  config = dict(config)
  found = {}
  for part in config.get("sum", []):
    found.update(estimator_settings(part if isinstance(part, str) else
                                    {k: v for k, v in dict(part).items() if k != "weight"}))
  if "of" in config:
    found.update(estimator_settings(config["of"]))
  if "name" in config:
    found[config["name"]] = {k: v for k, v in config.items() if k != "name"}
  return found


def exact_credit(model, task: tasks.TrainTask, tokens, mask, examples) -> oracle.OracleCredit:
  """The exact oracle for `task` (filler-blind key_token)."""
  if task.name != "key_token":
    raise ValueError(f"An exact oracle exists for key_token only, not {task.name!r}; use vineppo (Monte Carlo).")
  targets = np.stack([np.asarray(e["targets"]) for e in examples])
  return oracle.decisive_credit(model, task.config, tokens, mask, targets)


def credit_hook(advantage: str | Mapping[str, Any], *, temperature: float = 1.0) -> RolloutHook | None:
  """A hook computing the extras `advantage` needs, or None if it needs none."""
  settings = estimator_settings(advantage)
  mc_name = next((name for name in MC_POSITIONS if name in settings), None)
  needs_oracle = any(name in settings for name in ORACLE_ESTIMATORS)
  prm = ImplicitPRM(beta=float(settings["prime"].get("beta", 0.05)), temperature=temperature) \
      if "prime" in settings else None
  if mc_name is None and not needs_oracle and prm is None and "ktae" not in settings:
    return None

  def hook(task, model, rollout, examples, key, rl_step):
    del rl_step
    tokens, mask = np.asarray(rollout.tokens), np.asarray(rollout.mask)
    extras, metrics = {}, {}
    if mc_name is not None:
      mc = settings[mc_name]
      credit = oracle.mc_credit(model, task, tokens, mask, np.asarray(rollout.extras["token_valid"]), examples, key,
                                k=int(mc.get("k", 4)), positions=str(mc.get("positions", MC_POSITIONS[mc_name])),
                                logprobs=np.asarray(rollout.logprobs), temperature=temperature)
      extras.update(mc_values=credit.values, mc_evaluated=credit.evaluated)
      metrics.update(gen_tokens=credit.cost["gen_tokens"], mc_rollouts=credit.cost["rollouts"])
    if needs_oracle:
      credit = exact_credit(model, task, tokens, mask, examples)
      extras.update(oracle_advantages=credit.advantages, oracle_values=credit.values)
      metrics.update(oracle_passes=credit.cost["passes"])
    if "ktae" in settings:
      scores = token_statistics.ktae_scores(tokens, mask, np.asarray(rollout.rewards), rollout.group_size)
      extras.update(ktae_scores=jnp.asarray(scores, jnp.float32))
    if prm is not None:
      prm_extras, prm_metrics = prm(task, model, rollout)
      extras.update(prm_extras)
      metrics.update(prm_metrics)
    return extras, metrics

  return hook
