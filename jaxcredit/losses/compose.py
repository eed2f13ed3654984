"""Composable objectives: a training loss as a named sum of terms (optax-style).

A *term* is a pure function `term(outputs, rollout, estimate, step) ->
(scaled_loss, metrics)` built by a small factory; `combine` adds terms and
namespaces their metrics by term name:

  objective = combine(
      policy=ppo_clip(clip_high=0.28),
      kl=kl_term(coef=0.01, kind="k3"),
      entropy=entropy_term(coef=optax.linear_schedule(1e-3, 0.0, 1000)),
  )
  loss, metrics = objective(outputs, rollout, estimate, step)
  # metrics: loss, policy/value, policy/clipfrac, kl/value, kl/coef, ...

Coefficients are floats or optax schedules of the step. `from_config` builds
an objective from a dict / ConfigDict, so experiments select terms by name.
"""

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import optax
from jax import Array

from jaxcredit.losses import registered
from jaxcredit.rollout import Estimate, PolicyOutputs, Rollout

Coefficient = float | Callable[[Array], Array]
TermFn = Callable[..., tuple[Array, dict[str, Array]]]


def term(loss: str | Callable, *, coef: Coefficient = 1.0, **hparams) -> TermFn:
  """An objective term from a registered loss, scaled by a coefficient.

  Args:
    loss: a registered loss's name, or a function with the registry's signature
      ``fn(outputs, rollout, estimate, **hparams) -> (loss, metrics)``.
    coef: a float, or an optax schedule of the step.
    **hparams: the loss's keyword arguments.

  Returns:
    ``term(outputs, rollout, estimate, step=0) -> (scaled_loss, metrics)``.
    The metrics are the loss's own, plus `value` (unscaled) and `coef` (at `step`).

  Raises:
    ValueError: on an unknown loss name.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo, estimators
    >>> from jaxcredit.losses import compose
    >>> from jaxcredit.rollout import PolicyOutputs
    >>> rollout = demo.sample_rollout()
    >>> outputs = PolicyOutputs(logprobs=jnp.zeros((8, 8)), entropy=jnp.ones((8, 8)))
    >>> bonus = compose.term("entropy", coef=0.5)
    >>> loss, metrics = bonus(outputs, rollout, estimators.get("grpo")(rollout))
    >>> float(loss), float(metrics["value"]), float(metrics["coef"])
    (-0.5, -1.0, 0.5)
  """
  loss_fn = registered.get(loss) if isinstance(loss, str) else loss

  def fn(outputs: PolicyOutputs, rollout: Rollout, estimate: Estimate, step: Array | int = 0):
    value, metrics = loss_fn(outputs, rollout, estimate, **hparams)
    scale = jnp.asarray(coef(step) if callable(coef) else coef, jnp.float32)
    return scale * value, {**metrics, "value": value, "coef": scale}

  return fn


def ppo_clip(*, coef: Coefficient = 1.0, **hparams) -> TermFn:
  """The PPO clipped surrogate as a term.

  Args:
    coef: a float, or an optax schedule of the step.
    **hparams: `ppo_clip_loss`'s keyword arguments.

  Returns:
    ``term(outputs, rollout, estimate, step=0) -> (scaled_loss, metrics)``.

  Examples:
    >>> from jaxcredit.losses import compose
    >>> objective = compose.combine(policy=compose.ppo_clip(clip_high=0.28))
    >>> callable(objective)
    True
  """
  return term("ppo_clip", coef=coef, **hparams)


def kl_term(*, coef: Coefficient, kind: str = "k3", aggregation: str = "token-mean") -> TermFn:
  """``coef * KL(pi || ref)``, estimated with `kind` on the sampled tokens, as a term.

  Args:
    coef: a float, or an optax schedule of the step.
    kind: the estimator of `kl_penalty` ("k1", "k2", "k3", ...).
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``term(outputs, rollout, estimate, step=0) -> (scaled_loss, metrics)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo, estimators
    >>> from jaxcredit.losses import compose
    >>> from jaxcredit.rollout import PolicyOutputs
    >>> rollout = demo.sample_rollout()
    >>> rollout = rollout.replace(ref_logprobs=jnp.zeros((8, 8)))
    >>> outputs = PolicyOutputs(logprobs=jnp.zeros((8, 8)))
    >>> loss, metrics = compose.kl_term(coef=0.1)(outputs, rollout, estimators.get("grpo")(rollout))
    >>> float(loss)  # the policy equals the reference
    0.0
  """
  return term("kl", coef=coef, kind=kind, aggregation=aggregation)


def entropy_term(*, coef: Coefficient, aggregation: str = "token-mean") -> TermFn:
  """``coef * (-entropy)`` as a term: a positive coef rewards exploration.

  Args:
    coef: a float, or an optax schedule of the step.
    aggregation: how token losses are reduced (`aggregate`'s modes).

  Returns:
    ``term(outputs, rollout, estimate, step=0) -> (scaled_loss, metrics)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo, estimators
    >>> from jaxcredit.losses import compose
    >>> from jaxcredit.rollout import PolicyOutputs
    >>> rollout = demo.sample_rollout()
    >>> outputs = PolicyOutputs(logprobs=jnp.zeros((8, 8)), entropy=jnp.full((8, 8), 2.0))
    >>> loss, _ = compose.entropy_term(coef=0.1)(outputs, rollout, estimators.get("grpo")(rollout))
    >>> round(float(loss), 4)
    -0.2
  """
  return term("entropy", coef=coef, aggregation=aggregation)


def combine(**terms: TermFn) -> TermFn:
  """The objective ``sum_k term_k``.

  Args:
    **terms: named terms (`term`, `ppo_clip`, `kl_term`, ...).

  Returns:
    ``objective(outputs, rollout, estimate, step=0) -> (loss, metrics)``, metrics namespaced
    ``<term>/<metric>``, plus `loss`.

  Raises:
    ValueError: with no terms.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo, estimators
    >>> from jaxcredit.losses import compose
    >>> from jaxcredit.rollout import PolicyOutputs
    >>> rollout = demo.sample_rollout()
    >>> outputs = PolicyOutputs(logprobs=jnp.zeros((8, 8)), entropy=jnp.ones((8, 8)))
    >>> objective = compose.combine(bonus=compose.entropy_term(coef=0.1),
    ...                             again=compose.entropy_term(coef=0.2))
    >>> loss, metrics = objective(outputs, rollout, estimators.get("grpo")(rollout))
    >>> round(float(loss), 4), sorted(m for m in metrics if m.startswith("bonus/"))
    (-0.3, ['bonus/coef', 'bonus/entropy', 'bonus/value'])
  """
  if not terms:
    raise ValueError("combine needs at least one named term.")

  def objective(outputs: PolicyOutputs, rollout: Rollout, estimate: Estimate,
                step: Array | int = 0):
    total = jnp.zeros((), jnp.float32)
    metrics: dict[str, Array] = {}
    for name, fn in terms.items():
      value, term_metrics = fn(outputs, rollout, estimate, step)
      total = total + value
      metrics.update({f"{name}/{key}": v for key, v in term_metrics.items()})
    metrics["loss"] = total
    return total, metrics

  return objective


def _coefficient(spec: Any) -> Coefficient:
  """A float, or {"schedule": "<optax schedule factory>", **kwargs}."""
  if isinstance(spec, (int, float)):
    return float(spec)
  spec = dict(spec)
  name = spec.pop("schedule", None)
  factory = getattr(optax, name, None) if isinstance(name, str) else None
  if factory is None or not name.endswith("schedule"):
    raise ValueError(
        f"A coefficient is a number or {{'schedule': '<optax *_schedule>', ...}}; got {name!r}."
    )
  return factory(**spec)


def from_config(config: Mapping[str, Mapping[str, Any]]) -> TermFn:
  """An objective from ``{term_name: {"name": loss, "coef": c, **hparams}}``.

  `coef` defaults to 1 and may be ``{"schedule": "linear_schedule", ...}`` (any optax
  ``*_schedule`` factory and its arguments).

  Args:
    config: a dict or ``ml_collections.ConfigDict`` of that form.

  Returns:
    ``objective(outputs, rollout, estimate, step=0) -> (loss, metrics)``, as `combine`.

  Raises:
    ValueError: on a term without a name, an unknown loss or an unknown schedule.

  Examples:
    >>> from jaxcredit.losses import compose
    >>> objective = compose.from_config({
    ...     "policy": {"name": "ppo_clip", "clip_high": 0.28},
    ...     "kl": {"name": "kl", "coef": {"schedule": "linear_schedule", "init_value": 0.01,
    ...                                  "end_value": 0.0, "transition_steps": 100}}})
    >>> callable(objective)
    True
  """
  terms = {}
  for term_name, spec in dict(config).items():
    spec = dict(spec)
    if "name" not in spec:
      raise ValueError(f"Objective term {term_name!r} needs a 'name' (a registered loss).")
    loss = spec.pop("name")
    terms[term_name] = term(loss, coef=_coefficient(spec.pop("coef", 1.0)), **spec)
  return combine(**terms)
