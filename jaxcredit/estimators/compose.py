"""Composable advantages: build one token-level advantage from several.

An *advantage function* maps a `Rollout` to an `Estimate`. Any registered
estimator becomes one with `component(name, **hparams)`; the combinators
below return new advantage functions, so they nest (the token selectors and weights
`masked` and `reweighted` take are in `token_selectors`):

  mix = weighted_sum((0.7, component("grpo")), (0.3, component("prime", beta=0.05)))
  focus = masked(mix, high_entropy_tokens(rho=0.2))
  adv = focus(rollout).advantages                     # [B, T]

`from_config` builds the same from nested dicts (what `experiments/` files
hold). Every result is 0 at masked positions and jit-safe. Each advantage
function lists the registered estimators it is built from
(`components(fn)`: name, resolved settings, the extras they need), which is
how the training loop knows which extras providers to run.
"""

import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxcredit._masking import as_bool, masked_mean
from jaxcredit.estimators import registered
from jaxcredit.estimators.token_selectors import SELECTORS, WEIGHTS, TokenFn
from jaxcredit.rollout import Estimate, Rollout

AdvantageFn = Callable[[Rollout], Estimate]


class Component(NamedTuple):
  """A registered estimator inside an advantage function.

  Attributes:
    name: its registered name.
    settings: its keyword arguments and its providers' settings, defaults filled in (what
      the extras providers read, e.g. k, beta).
    needs: the rollout.extras keys it reads.
  """

  name: str
  settings: Mapping[str, Any]
  needs: tuple[str, ...]


def components(advantage: AdvantageFn) -> tuple[Component, ...]:
  """The registered estimators an advantage function is built from.

  Args:
    advantage: an advantage function from `component`, a combinator or `from_config`, or a
      hand-written one.

  Returns:
    the `Component` of each registered estimator, in config order; empty for a hand-written
    function.

  Examples:
    >>> from jaxcredit import estimators
    >>> estimators.components(estimators.component("gae", lam=0.9))[0].name
    'gae'
  """
  return getattr(advantage, "components", ())


def _keyword_defaults(fn: Callable) -> dict[str, Any] | None:
  """{keyword: default} of an estimator's hyperparameters; None if it takes **kwargs."""
  parameters = list(inspect.signature(fn).parameters.values())[1:]  # after the rollout
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
    return None
  return {p.name: p.default for p in parameters}


def component(name: str, **hparams) -> AdvantageFn:
  """A registered estimator with its hyperparameters bound, as an advantage function.

  Settings of the estimator's extras providers (`register(..., settings=)`) are recorded in
  its `Component`, not passed to the estimator.

  Args:
    name: a registered estimator's name.
    **hparams: the estimator's keyword arguments and its providers' settings.

  Returns:
    ``advantage(rollout) -> Estimate`` whose `components` is one `Component`.

  Raises:
    ValueError: on an unknown name, or a setting neither the estimator nor its providers take.

  Examples:
    >>> from jaxcredit import demo
    >>> from jaxcredit.estimators import compose
    >>> gae = compose.component("gae", lam=0.9)
    >>> gae(demo.sample_rollout()).advantages.shape
    (8, 8)
    >>> compose.components(gae)[0].settings["lam"]
    0.9
  """
  estimator, info = registered.get(name), registered.REGISTRY.info(name)
  own = _keyword_defaults(estimator)
  provider_settings = info.get("settings", {})
  if own is not None:
    unknown = sorted(set(hparams) - set(own) - set(provider_settings))
    if unknown:
      known = sorted({*own, *provider_settings})
      raise ValueError(f"Estimator {name!r} has no setting {unknown[0]!r}; it takes: "
                       f"{', '.join(known) or 'no settings'}.")
  passed = hparams if own is None else {k: v for k, v in hparams.items() if k in own}
  defaults = {k: v for k, v in (own or {}).items() if v is not inspect.Parameter.empty}

  def advantage(rollout: Rollout) -> Estimate:
    return estimator(rollout, **passed)

  advantage.__name__ = name
  settings = {**defaults, **provider_settings, **hparams}
  advantage.components = (Component(name, settings, info.get("needs", ())),)
  return advantage


def _built_from(advantage: AdvantageFn, *parts: AdvantageFn) -> AdvantageFn:
  advantage.components = tuple(c for part in parts for c in components(part))
  return advantage


def _as_fn(spec: str | AdvantageFn) -> AdvantageFn:
  return component(spec) if isinstance(spec, str) else spec


def weighted_sum(*weighted: tuple[float, str | AdvantageFn]) -> AdvantageFn:
  """A weighted sum of advantage functions::

    A = sum_k w_k A_k          (e.g. lam * A_grpo + (1 - lam) * A_prm)

  Returns are summed with the same weights when every component has them, else None.

  Args:
    *weighted: ``(weight, estimator)`` pairs; an estimator is a registered name or an
      advantage function.

  Returns:
    ``advantage(rollout) -> Estimate`` built from every part's components.

  Raises:
    ValueError: with no pairs, or an unknown estimator name.

  Examples:
    >>> import numpy as np
    >>> from jaxcredit import demo
    >>> from jaxcredit.estimators import compose
    >>> mix = compose.weighted_sum((0.5, "grpo"), (0.5, "rloo"))
    >>> rollout = demo.sample_rollout()
    >>> both = 0.5 * compose.component("grpo")(rollout).advantages + 0.5 * compose.component(
    ...     "rloo")(rollout).advantages
    >>> bool(np.allclose(mix(rollout).advantages, both))
    True
  """
  if not weighted:
    raise ValueError("weighted_sum needs at least one (weight, estimator) pair.")
  parts = [(float(w), _as_fn(fn)) for w, fn in weighted]

  def advantage(rollout: Rollout) -> Estimate:
    estimates = [(w, fn(rollout)) for w, fn in parts]
    advantages = sum(w * e.advantages for w, e in estimates)
    has_returns = all(e.returns is not None for _, e in estimates)
    returns = sum(w * e.returns for w, e in estimates) if has_returns else None
    return Estimate(advantages=advantages, returns=returns)

  return _built_from(advantage, *(fn for _, fn in parts))


def masked(base: str | AdvantageFn, select: TokenFn) -> AdvantageFn:
  """Keeps a base estimator's advantages on selected tokens and zeroes the rest.

  Args:
    base: a registered estimator's name or an advantage function.
    select: ``select(rollout) -> [B, T]`` bool, the tokens to keep (e.g.
      `high_entropy_tokens`).

  Returns:
    ``advantage(rollout) -> Estimate`` with ``A = A_base`` where selected and valid, else 0.

  Examples:
    >>> from jaxcredit import demo
    >>> from jaxcredit.estimators import compose
    >>> rollout = demo.sample_rollout()
    >>> first = lambda rollout: rollout.mask & (rollout.mask.cumsum(axis=1) == 1)
    >>> only_first = compose.masked("grpo", first)
    >>> int((only_first(rollout).advantages != 0).sum(axis=1).max())
    1
  """
  base = _as_fn(base)

  def advantage(rollout: Rollout) -> Estimate:
    estimate = base(rollout)
    keep = as_bool(select(rollout)) & as_bool(rollout.mask)
    return estimate._replace(advantages=jnp.where(keep, estimate.advantages, 0.0))

  return _built_from(advantage, base)


def reweighted(base: str | AdvantageFn, weights: TokenFn) -> AdvantageFn:
  """A base estimator's advantages times per-token weights.

  Args:
    base: a registered estimator's name or an advantage function.
    weights: ``weights(rollout) -> [B, T]`` float (e.g. `surprisal`).

  Returns:
    ``advantage(rollout) -> Estimate`` with ``A = A_base * w`` at valid tokens, 0 elsewhere.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo
    >>> from jaxcredit.estimators import compose
    >>> rollout = demo.sample_rollout()
    >>> doubled = compose.reweighted("grpo", lambda rollout: jnp.full(rollout.mask.shape, 2.0))
    >>> a, b = doubled(rollout).advantages, compose.component("grpo")(rollout).advantages
    >>> bool(jnp.allclose(a, 2 * b))
    True
  """
  base = _as_fn(base)

  def advantage(rollout: Rollout) -> Estimate:
    estimate = base(rollout)
    scale = jnp.where(as_bool(rollout.mask), weights(rollout), 0.0)
    return estimate._replace(advantages=estimate.advantages * scale)

  return _built_from(advantage, base)


def rms_scaled(base: str | AdvantageFn) -> AdvantageFn:
  """A base estimator's advantages divided by their batch RMS over valid tokens::

    A = A_base / sqrt(mean_valid A_base^2)

  Every estimator then takes steps of one size, so comparisons at one learning rate are fair.

  Args:
    base: a registered estimator's name or an advantage function.

  Returns:
    ``advantage(rollout) -> Estimate``; all-zero credit stays 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import demo
    >>> from jaxcredit.estimators import compose
    >>> rollout = demo.sample_rollout()
    >>> a = compose.rms_scaled("dr_grpo")(rollout).advantages
    >>> round(float(jnp.sqrt(jnp.sum(a**2) / jnp.sum(rollout.mask))), 4)
    1.0
  """
  base = _as_fn(base)

  def advantage(rollout: Rollout) -> Estimate:
    estimate = base(rollout)
    valid = as_bool(rollout.mask)
    power = masked_mean(jnp.where(valid, estimate.advantages, 0.0) ** 2, valid)
    scale = jnp.where(power > 0, jax.lax.rsqrt(jnp.where(power > 0, power, 1.0)), 0.0)
    return estimate._replace(advantages=jnp.where(valid, estimate.advantages * scale, 0.0))

  return _built_from(advantage, base)


def from_config(config: str | Mapping[str, Any]) -> AdvantageFn:
  """An advantage function from a (nested) config.

  The forms a config takes::

    "grpo"                                   a registered estimator, defaults
    {"name": "gae", "lam": 0.9}              with hyperparameters
    {"sum": [{"weight": 0.7, "name": "grpo"}, {"weight": 0.3, "name": "prime"}]}
    {"sum": ["grpo", "prime"]}                weights 1
    {"mask": "high_entropy", "rho": 0.2, "of": <config>}
    {"mask": "groups_with_success", "of": <config>}   zero on groups where every response failed
    {"reweight": "surprisal", "of": <config>}
    {"scale": "rms", "of": <config>}          divided by the batch RMS over valid tokens

  Args:
    config: a registered estimator's name, or a dict or ``ml_collections.ConfigDict`` of the
      forms above.

  Returns:
    ``advantage(rollout) -> Estimate``.

  Raises:
    ValueError: on an unknown estimator name or key.

  Examples:
    >>> from jaxcredit import demo, estimators
    >>> mix = estimators.from_config({"sum": [{"weight": 0.5, "name": "grpo"},
    ...                                         {"weight": 0.5, "name": "rloo"}]})
    >>> [c.name for c in estimators.components(mix)]
    ['grpo', 'rloo']
    >>> mix(demo.sample_rollout()).advantages.shape
    (8, 8)
  """
  if isinstance(config, str):
    return component(config)
  config = dict(config)
  if "sum" in config:
    parts = [{"name": part} if isinstance(part, str) else dict(part) for part in config["sum"]]
    return weighted_sum(*[
        (float(part.pop("weight", 1.0)), from_config(part)) for part in parts
    ])
  if "mask" in config:
    kind = config.pop("mask")
    base = from_config(config.pop("of"))
    if kind not in SELECTORS:
      raise ValueError(f"Unknown token selector {kind!r}; known: {', '.join(SELECTORS)}.")
    return masked(base, SELECTORS[kind](**config))
  if "reweight" in config:
    kind = config.pop("reweight")
    if kind not in WEIGHTS or set(config) != {"of"}:
      raise ValueError(f"reweight takes one of {', '.join(WEIGHTS)} and an 'of' entry; "
                       f"got {kind!r}, {sorted(config)}.")
    return reweighted(from_config(config["of"]), WEIGHTS[kind])
  if "scale" in config:
    if config.get("scale") != "rms" or set(config) != {"scale", "of"}:
      raise ValueError(f"scale takes 'rms' and an 'of' entry; got {config}.")
    return rms_scaled(from_config(config["of"]))
  if "name" in config:
    name = config.pop("name")
    return component(name, **config)
  raise ValueError("An advantage config needs one of 'name', 'sum', 'mask', 'reweight', "
                   f"'scale'; got keys {sorted(config)}.")
