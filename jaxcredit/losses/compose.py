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
  """A term from a registered loss name (or a function with the registry's
  signature `fn(outputs, rollout, estimate, **hparams)`), scaled by `coef`.

  Metrics: the loss's own, plus `value` (unscaled) and `coef` (at `step`).
  """
  loss_fn = registered.get(loss) if isinstance(loss, str) else loss

  def fn(outputs: PolicyOutputs, rollout: Rollout, estimate: Estimate, step: Array | int = 0):
    value, metrics = loss_fn(outputs, rollout, estimate, **hparams)
    scale = jnp.asarray(coef(step) if callable(coef) else coef, jnp.float32)
    return scale * value, {**metrics, "value": value, "coef": scale}

  return fn


def ppo_clip(*, coef: Coefficient = 1.0, **hparams) -> TermFn:
  """PPO clipped surrogate term (see `ppo_clip_loss` for hparams)."""
  return term("ppo_clip", coef=coef, **hparams)


def kl_term(*, coef: Coefficient, kind: str = "k3", aggregation: str = "token-mean") -> TermFn:
  """coef * KL(pi || ref) estimated with `kind` on the sampled tokens."""
  return term("kl", coef=coef, kind=kind, aggregation=aggregation)


def entropy_term(*, coef: Coefficient, aggregation: str = "token-mean") -> TermFn:
  """coef * (-entropy): a positive coef rewards exploration."""
  return term("entropy", coef=coef, aggregation=aggregation)


def combine(**terms: TermFn) -> TermFn:
  """The objective sum_k term_k, metrics namespaced `<term>/<metric>`, plus `loss`."""
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

  `coef` defaults to 1 and may be {"schedule": "linear_schedule", ...}.
  Works with dicts and ml_collections.ConfigDict.
  """
  terms = {}
  for term_name, spec in dict(config).items():
    spec = dict(spec)
    if "name" not in spec:
      raise ValueError(f"Objective term {term_name!r} needs a 'name' (a registered loss).")
    loss = spec.pop("name")
    terms[term_name] = term(loss, coef=_coefficient(spec.pop("coef", 1.0)), **spec)
  return combine(**terms)
