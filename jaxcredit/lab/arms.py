"""What a batched cell's arms read and train beside the policy, traceable where it runs
inside the cell's program: the extras an arm's estimator needs, Monte-Carlo values drawn in
distribution from the exact values (and the continuation tokens they would cost), the
learned critic, PRIME's implicit PRM and its frozen reference, lambda-GRPO's learnt length
preference, and a run's modules.
"""

import dataclasses
import math
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxcredit import estimators
from jaxcredit.credit import extras
from jaxcredit.credit import length_preference as length_preference_lib
from jaxcredit.credit import monte_carlo as monte_carlo_lib
from jaxcredit.lab import providers  # noqa: F401  (registers the lab's traceable providers)
from jaxcredit.models import Transformer

if TYPE_CHECKING:
  from jaxcredit.lab.cells import Cell

# What a cell computes: the task's exact values and credit, simulated Monte-Carlo values, the
# implicit PRM's log-probs and lambda-GRPO's learnt length weights (here), and every traceable
# provider's extras (`extras.TRACEABLE`,
# the same functions the training loop runs).
EXTRAS = ("oracle_advantages", "oracle_values", "prm_logprobs", "length_weights",
          *estimators.registered_token.MC_VALUES, *extras.TRACEABLE.names())
CRITICS = ("gae",)  # estimators that read a learned critic's values V(s_t) (rollout.values)
CRITIC_LEARNING_RATE = 1e-3  # the critic's Adam (the policy's rate is tuned per arm)
PRM_LEARNING_RATE = 1e-3  # PRIME's implicit PRM's Adam
CRITIC_STREAM = 7  # the critic's initialisation key: fold_in(key(seed), CRITIC_STREAM)


def needs(advantages) -> set[str]:
  """The rollout.extras keys some advantage functions read.

  Args:
    advantages: advantage functions (`estimators.from_config`).

  Returns:
    the set of keys.

  Raises:
    ValueError: naming any key a batched cell does not compute (`EXTRAS`).
  """
  needs = {key for advantage in advantages for component in estimators.components(advantage)
           for key in component.needs}
  missing = needs - set(EXTRAS)
  if missing:
    raise ValueError(f"Batched cells compute the extras {', '.join(EXTRAS)}; the estimator "
                     f"needs {', '.join(sorted(missing))} too (train it with `jaxcredit.train`).")
  return needs


class MonteCarlo(NamedTuple):
  """The Monte-Carlo values an arm reads. The fields may be traced (one per arm, indexed by
  the arm inside a cell's program).

  Attributes:
    k: continuations per evaluated state (0: the arm reads none).
    stride: V-hat at every stride-th action of a response (`monte_carlo.position_rule`).
    threshold: V-hat at the actions with pi(y_t) < threshold (inf: every one).
  """

  k: int = 0
  stride: int = 1
  threshold: float = math.inf


def monte_carlo(advantage) -> MonteCarlo:
  """The Monte-Carlo values an advantage function reads (its components needing "mc_values":
  `vineppo`, `spo`), one setting per arm.

  Args:
    advantage: an advantage function.

  Returns:
    its `MonteCarlo` (k = 0 when it reads none).

  Raises:
    ValueError: on several settings in one arm, K < 1, or an unknown positions spec.
  """
  readers = [c for c in estimators.components(advantage) if "mc_values" in c.needs]
  settings = {(int(c.settings["k"]), c.settings["positions"]) for c in readers}
  if len(settings) > 1 or any(k < 1 for k, _ in settings):
    raise ValueError(f"Batched cells draw one set of Monte-Carlo values per arm, K >= 1; got "
                     f"(k, positions) {sorted(settings)}.")
  if not settings:
    return MonteCarlo()
  k, positions = settings.pop()
  return MonteCarlo(k, *monte_carlo_lib.position_rule(positions))


def monte_carlo_values(key, values, evaluated, k, largest: int):
  """Monte-Carlo value estimates drawn in distribution from the exact values. Traceable.

  With a 0/1 reward the k continuations' successes are Binomial(k, V(s_t)), V the exact
  value: they are drawn as that count, the sum of k of `largest` uniform comparisons.

  Args:
    key: a PRNG key.
    values: ``[B, L]`` the oracle's exact V(s_t).
    evaluated: ``[B, L]`` bool, the states evaluated (`monte_carlo.evaluated_positions`).
    k: continuations per state, ``0 <= k <= largest`` (may be traced).
    largest: the largest k of the cell (static).

  Returns:
    float32 ``[B, L]`` V-hat(s_t), the mean reward of k continuations, 0 off `evaluated`.
  """
  draws = jax.random.uniform(key, (*values.shape, largest)) < jnp.clip(values, 0.0, 1.0)[..., None]
  successes = jnp.sum(draws & (jnp.arange(largest) < k), axis=-1, dtype=jnp.float32)
  return jnp.where(evaluated, successes / jnp.maximum(k, 1), 0.0)


def continuation_tokens(evaluated, k, length: int):
  """The tokens k continuations from each evaluated state generate: k (T - t) summed over the
  states at response step t. Traceable.

  Args:
    evaluated: ``[B, L]`` bool, the states continued from; its last `length` columns are the
      response slots.
    k: continuations per state (may be traced).
    length: the response slots T.

  Returns:
    a float32 scalar.
  """
  remaining = jnp.arange(length, 0, -1, dtype=jnp.float32)  # T - t
  return k * jnp.sum(jnp.where(evaluated[:, -length:], remaining, 0.0))


def optimizer(cell: "Cell", model, learning_rate) -> nnx.Optimizer:
  """A run's Adam after global-norm clipping at ``cell.max_grad_norm``, its learning rate in the
  optimizer state (`optax.inject_hyperparams`, so it may be traced).

  Args:
    cell: the batched `Cell`.
    model: the module it updates.
    learning_rate: Adam's rate (may be traced).

  Returns:
    an `nnx.Optimizer`.
  """
  adam = optax.chain(optax.clip_by_global_norm(cell.max_grad_norm),
                     optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate))
  return nnx.Optimizer(model, adam, wrt=nnx.Param)


def reads_critic(advantage) -> bool:
  """Whether an advantage function reads a learned critic's values (a component in `CRITICS`).

  Args:
    advantage: an advantage function (`estimators.from_config`).

  Returns:
    bool.
  """
  return any(component.name in CRITICS for component in estimators.components(advantage))


def charges(advantage) -> tuple[MonteCarlo, bool, bool]:
  """What an arm is charged for beside sampling and its step (`lab.compute`).

  Args:
    advantage: an advantage function (`estimators.from_config`).

  Returns:
    ``(monte_carlo(advantage), reads_critic(advantage), reads_prm)``, reads_prm whether it
    reads PRIME's implicit PRM ("prm_logprobs").
  """
  return monte_carlo(advantage), reads_critic(advantage), "prm_logprobs" in needs([advantage])


def has_critic(cell: "Cell") -> bool:
  """Whether an arm of the cell reads a learned critic (`reads_critic`): then every run of the
  cell trains one (its own arm may ignore it).

  Args:
    cell: the batched `Cell`.

  Returns:
    bool.
  """
  return any(reads_critic(estimators.from_config(arm)) for arm in cell.arms)


def critic(cell: "Cell", policy: Transformer, seed) -> Transformer:
  """A critic as PPO critics start: the policy's architecture with a zero-initialised scalar
  value head, its trunk a copy of the policy's (after any warm start).

  Args:
    cell: the batched `Cell`.
    policy: the run's policy.
    seed: the run's seed (the head's initialisation key is ``fold_in(key(seed),
      CRITIC_STREAM)``).

  Returns:
    a `Transformer` with a value head.
  """
  critic = Transformer(dataclasses.replace(cell.model, value_head=True),
                       rngs=nnx.Rngs(jax.random.fold_in(jax.random.key(seed), CRITIC_STREAM)))
  nnx.update(critic, nnx.state(policy, nnx.Param))
  return critic


def prm_beta(cell: "Cell") -> float | None:
  """beta of the cell's PRIME arms (components needing "prm_logprobs"): with one, every run of
  the cell trains an implicit PRM (its own arm may ignore it).

  Args:
    cell: the batched `Cell`.

  Returns:
    beta, or None without a PRIME arm.

  Raises:
    ValueError: when the PRIME arms differ in beta.
  """
  betas = {float(c.settings["beta"]) for arm in cell.arms
           for c in estimators.components(estimators.from_config(arm)) if "prm_logprobs" in c.needs}
  if len(betas) > 1:
    raise ValueError(f"A cell trains one implicit PRM: its PRIME arms must share beta, got "
                     f"{sorted(betas)}.")
  return betas.pop() if betas else None


def length_preference(cell: "Cell") -> dict | None:
  """The settings (lam, r, lam_learning_rate) of the cell's learnt lambda-GRPO arms
  (components needing "length_weights"): with one, every run of the cell learns a length
  preference (`credit.length_preference`; its own arm may ignore it).

  Args:
    cell: the batched `Cell`.

  Returns:
    ``{"lam", "r", "learning_rate"}``, or None without such an arm.

  Raises:
    ValueError: when those arms differ in their settings.
  """
  settings = {(float(c.settings["lam"]), float(c.settings["r"]),
               float(c.settings["lam_learning_rate"]))
              for arm in cell.arms for c in estimators.components(estimators.from_config(arm))
              if "length_weights" in c.needs}
  if len(settings) > 1:
    raise ValueError(f"A cell learns one length preference: its lambda_grpo_learned arms must "
                     f"share (lam, r, lam_learning_rate), got {sorted(settings)}.")
  return dict(zip(("lam", "r", "learning_rate"), settings.pop())) if settings else None


def prm_learning_rates(cell: "Cell") -> tuple[float, ...]:
  """The implicit PRM's Adam rate in each arm's runs (`Cell.prm_learning_rates`).

  Args:
    cell: the batched `Cell`.

  Returns:
    one rate per arm (`PRM_LEARNING_RATE` where the cell gives none).
  """
  rates = cell.prm_learning_rates or (None,) * len(cell.arms)
  return tuple(PRM_LEARNING_RATE if rate is None else float(rate) for rate in rates)


def modules(model, cell: "Cell", learning_rate, critic=None,
             prm_learning_rate=PRM_LEARNING_RATE) -> dict:
  """A run's modules.

  The policy and its optimizer; the critic and its optimizer; with a PRIME arm, the implicit
  PRM (its Adam at `prm_learning_rate`, which may be traced) and the frozen reference, both
  copies of the starting policy (after any warm start), as PRIME starts them from the SFT
  model; with a learnt lambda-GRPO arm, the length preference and its Adam
  (`length_preference`).

  Args:
    model: the policy.
    cell: the batched `Cell`.
    learning_rate: the policy's Adam rate (may be traced).
    critic: the critic, or None.
    prm_learning_rate: the implicit PRM's Adam rate.

  Returns:
    ``{name: module or optimizer}``.
  """
  modules = {"model": model, "optimizer": optimizer(cell, model, learning_rate)}
  adam = lambda rate: optax.chain(optax.clip_by_global_norm(cell.max_grad_norm), optax.adam(rate))
  if critic is not None:
    modules.update(critic=critic, critic_optimizer=nnx.Optimizer(
        critic, adam(CRITIC_LEARNING_RATE), wrt=nnx.Param))
  if prm_beta(cell) is not None:
    prm = nnx.clone(model)
    # Plain Adam, as the trainer's `implicit_prm.ImplicitPRM`.
    prm_adam = optax.inject_hyperparams(optax.adam)(learning_rate=prm_learning_rate)
    modules.update(prm=prm, prm_optimizer=nnx.Optimizer(prm, prm_adam, wrt=nnx.Param),
                   reference=nnx.clone(model))
  preference = length_preference(cell)
  if preference is not None:
    modules.update(length_preference_lib.modules(**preference))
  return modules
