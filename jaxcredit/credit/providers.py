"""The built-in extras providers, registered with `credit.extras` when imported.

Monte-Carlo values (vineppo, spo), the implicit PRM (prime), KTAE's key-token scores,
multi-turn per-turn baselines (turn_baseline), RAE's per-role reward baselines (rae),
lambda-GRPO's learnt length weights (lambda_grpo_learned) and a task's reward components
(gdpo). Each is found by the extras key it provides (`extras.provider_factory`), never by its
name here.
"""

from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from jaxcredit import estimators, tasks
from jaxcredit.credit import implicit_prm, length_preference, monte_carlo, token_statistics
from jaxcredit.credit.extras import Context, Hook, register, register_traceable
from jaxcredit.rollout import Rollout


@register(*estimators.registered_token.MC_VALUES)
def _monte_carlo_values(settings: Mapping, *, temperature: float) -> Hook:
  """V(s_t) from `k` continuations per position at `positions` (monte_carlo.mc_credit)."""
  k, positions = int(settings["k"]), str(settings["positions"])

  def provide(context: Context, rollout: Rollout) -> tuple[dict, dict]:
    credit = monte_carlo.mc_credit(context.model, context.task, rollout.tokens, rollout.mask,
                                   rollout.token_valid, context.examples, context.key, k=k,
                                   positions=positions,
                                   logprobs=np.asarray(rollout.behaviour_logprobs),
                                   temperature=temperature)
    return ({"mc_values": credit.values, "mc_evaluated": credit.evaluated},
            {"gen_tokens": credit.cost["gen_tokens"], "mc_rollouts": credit.cost["rollouts"]})

  return provide


class _ImplicitPRMProvider:
  """PRIME's implicit PRM as a stateful provider (its `start` and `modules`: see `Chain`)."""

  def __init__(self, prm: implicit_prm.ImplicitPRM):
    self.prm = prm
    self.start, self.modules = prm.start, prm.modules

  def __call__(self, context: Context, rollout: Rollout) -> tuple[dict, dict]:
    return self.prm(context.task, context.model, rollout)


@register("prm_logprobs")
def _implicit_prm(settings: Mapping, *, temperature: float) -> Hook:
  """PRIME's implicit PRM (implicit_prm.ImplicitPRM), trained on each batch after scoring it."""
  return _ImplicitPRMProvider(
      implicit_prm.ImplicitPRM(beta=float(settings["beta"]), temperature=temperature))


@register("length_weights", per="sequence")
def _length_weights(settings: Mapping, *, temperature: float) -> Hook:
  """lambda-GRPO's length weights under a learnt preference exponent
  (length_preference.LengthPreferenceProvider)."""
  del temperature
  return length_preference.LengthPreferenceProvider(
      float(settings["lam"]), float(settings["r"]), float(settings["lam_learning_rate"]))


@register_traceable("ktae_scores")
def _ktae_scores(rollout: Rollout, key: Array, vocab_size: int) -> dict:
  """KTAE's per-group key-token scores (token_statistics.ktae_scores) of the sampled tokens
  and rewards, no settings."""
  del key
  return {"ktae_scores": token_statistics.ktae_scores(rollout.tokens, rollout.mask,
                                                       rollout.rewards, rollout.group_size,
                                                       vocab_size=vocab_size)}


class RoleBaselines(nnx.Module):
  """RAE's baselines: an exponential moving average of the reward of each role, kept across
  steps (and checkpointed with the policy).

  Args:
    roles: how many roles (role ids are 0 .. roles - 1).

  Attributes:
    values: ``[roles]`` float32 baselines, 0 before a role's first batch.
  """

  def __init__(self, roles: int):
    self.values = nnx.Variable(jnp.zeros(roles, jnp.float32))


class _RoleBaselineProvider:
  """Each row's role baseline before this batch (what RAE subtracts: a function of earlier
  batches only), then the update ``b <- decay b + (1 - decay) mean(r of the role's rows)``."""

  def __init__(self, roles: int, decay: float):
    if not 0.0 <= decay < 1.0:
      raise ValueError(f"RAE's decay must be in [0, 1), got {decay!r}.")
    if roles < 1:
      raise ValueError(f"RAE needs roles >= 1, got {roles!r}.")
    self.baselines, self.decay = RoleBaselines(roles), decay

  def modules(self) -> dict:
    """{"role_baselines": RoleBaselines}: what a checkpoint saves and restores."""
    return {"role_baselines": self.baselines}

  def __call__(self, context: Context, rollout: Rollout) -> tuple[dict, dict]:
    rows = rollout.shape[0]
    roles = np.asarray(rollout.extras.get("roles", np.zeros(rows, np.int32)))
    values = np.array(self.baselines.values[...], np.float64)
    if roles.shape != (rows,) or not np.issubdtype(roles.dtype, np.integer) or (
        roles.min() < 0 or roles.max() >= len(values)):
      raise ValueError(f"rollout.extras['roles'] must be [B] = [{rows}] int role ids in "
                       f"[0, {len(values)}) (the rae setting `roles`), got {roles.dtype} "
                       f"{list(roles.shape)} ranging {roles.min()}..{roles.max()}.")
    before = values[roles]
    rewards = np.asarray(rollout.rewards, np.float64)
    for role in np.unique(roles):
      values[role] = self.decay * values[role] + (1.0 - self.decay) * rewards[roles == role].mean()
    self.baselines.values[...] = jnp.asarray(values, jnp.float32)
    return ({"role_baselines": jnp.asarray(before, jnp.float32)},
            {"rae_baseline_mean": float(before.mean())})


@register("role_baselines", per="sequence")
def _role_baselines(settings: Mapping, *, temperature: float) -> Hook:
  """RAE's per-role reward baselines (`RoleBaselines`), roles from rollout.extras["roles"]
  (one role without it)."""
  del temperature
  return _RoleBaselineProvider(int(settings["roles"]), float(settings["decay"]))


def _no_components(task) -> str | None:
  """Why `task` gives no reward components (None when it does)."""
  if task.score_components is None:
    return ("its reward has no components (a TrainTask with score_components gives them, "
            "e.g. countdown: correct, well-formed)")
  return None


@register("reward_components", per="vector", refuses=_no_components)
def _reward_components(settings: Mapping, *, temperature: float) -> Hook:
  """Each response's reward components (`TrainTask.component_rows`), for GDPO."""
  del settings, temperature

  def provide(context: Context, rollout: Rollout) -> tuple[dict, dict]:
    components = context.task.component_rows(np.asarray(rollout.tokens),
                                              np.asarray(rollout.mask), context.examples)
    return {"reward_components": jnp.asarray(components)}, {}

  return provide


@register("turn_baselines")
def _turn_baselines(settings: Mapping, *, temperature: float) -> Hook:
  """Per-turn baselines of a multi-turn task: the mean reward of `k` continuations
  branched from each turn's start (`rollout_sources.MultiTurn.returns_to_go`)."""
  samples = int(settings["k"])

  def provide(context: Context, rollout: Rollout) -> tuple[dict, dict]:
    source = tasks.multi_turn_source(context.task, temperature=temperature)
    baselines, generated = source.returns_to_go(context.model, rollout, context.examples,
                                                samples=samples, key=context.key)
    return {"turn_baselines": jnp.asarray(baselines)}, {"gen_tokens": generated}

  return provide
