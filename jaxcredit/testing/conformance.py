"""Conformance checks for estimators and losses, built on JAX and hypothesis.

`check_estimator(fn)` and `check_loss(fn)` run a function on random valid
rollouts (`strategies.rollouts`) and on a fixed set of degenerate ones, and
raise `ConformanceError` naming the property, the (shrunk) input and the
offending values when one fails.
"""

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings

from jaxcredit.rollout import Estimate, PolicyOutputs, Rollout
from jaxcredit.testing import strategies

Invariance = tuple[str, Callable[[Rollout], Rollout]]


class ConformanceError(AssertionError):
  """A conformance property failed; the message names it, the input and the values."""


def describe(rollout: Rollout) -> str:
  """A compact, printable description of a rollout (what a `ConformanceError` shows).

  Args:
    rollout: a `Rollout`.

  Returns:
    its shape, group size, mask, rewards and the dtypes of its float fields.
  """
  with np.printoptions(precision=3, suppress=True, threshold=200, linewidth=120):
    lines = [
        f"Rollout(B={rollout.shape[0]}, T={rollout.shape[1]}, group_size={rollout.group_size})"
    ]
    lines.append(f"  mask=\n{np.asarray(rollout.mask).astype(int)}")
    lines.append(f"  rewards={np.asarray(rollout.rewards, np.float32)}")
    for name in ("behaviour_logprobs", "values"):
      if getattr(rollout, name) is not None:
        lines.append(f"  {name} dtype={getattr(rollout, name).dtype}")
  return "\n".join(lines)


def _fail(prop: str, what: str, rollout: Rollout, detail: str) -> None:
  raise ConformanceError(f"[{prop}] {what}: {detail}\ninput: {describe(rollout)}")


def _offending(values: np.ndarray, where: np.ndarray, limit: int = 5) -> str:
  idx = np.argwhere(where)[:limit]
  return ", ".join(f"{tuple(int(i) for i in ix)}={values[tuple(ix)]!r}" for ix in idx)


def _replace_token_fields(rollout: Rollout, fn: Callable[[jax.Array], jax.Array]) -> Rollout:
  """Applies fn to every float [B, T] field and [B, T] extra."""
  shape = rollout.shape
  def apply(x):
    is_token_float = x is not None and x.shape == shape and jnp.issubdtype(x.dtype, jnp.floating)
    return fn(x) if is_token_float else x
  changes = {f.name: apply(getattr(rollout, f.name)) for f in dataclasses.fields(rollout)
             if f.name not in ("extras", "group_size", "tokens", "mask")}
  return rollout.replace(**changes, extras={k: apply(v) for k, v in rollout.extras.items()})


def poison_masked(rollout: Rollout, value: float = jnp.nan) -> Rollout:
  """A rollout with `value` at every masked position of every float ``[B, T]`` array.

  Args:
    rollout: a `Rollout`.
    value: the poison, NaN by default.

  Returns:
    the poisoned `Rollout` (masks, tokens and group size unchanged).
  """
  return _replace_token_fields(rollout,
                               lambda x: jnp.where(rollout.mask, x, jnp.asarray(value, x.dtype)))


HUGE_REWARD = 1e19
"""Rewards of this size square past float32's max: normalised advantages must not collapse to 0."""
LARGE_LOG_RATIO = 100.0
"""A log-ratio whose exp overflows float32 (a stale behaviour policy): losses and
estimators must keep finite values and gradients."""


def _alternating(shape: tuple[int, int], size: float) -> jax.Array:
  """+size and -size in a checkerboard of `shape`."""
  rows, columns = np.indices(shape)
  return jnp.asarray(np.where((rows + columns) % 2 == 0, size, -size), jnp.float32)


def degenerate_rollouts(group_sizes: Sequence[int] = (1, 2, 4)) -> list[tuple[str, Rollout]]:
  """Named edge cases, all ``[8, 6]`` (one compilation).

  All-masked rows, zero-variance groups, size-1 groups, length-1 responses, bf16 inputs,
  extreme log-probs, rewards of +-1e19 and target/behaviour log-ratios of +-100
  (extras["target_logprobs"]).

  Args:
    group_sizes: the group sizes used, each dividing 8.

  Returns:
    ``[(name, rollout)]``.
  """
  rng = np.random.default_rng(0)
  pick = lambda i: group_sizes[i % len(group_sizes)]
  base = lambda g: strategies.make_rollout(rng, batch=8, length=6, group_size=g)
  first, second = base(pick(0)), base(pick(1))
  cases = [
      ("all rows masked", first.replace(mask=jnp.zeros_like(first.mask))),
      ("zero-variance groups", second.replace(rewards=jnp.ones_like(second.rewards))),
      ("length-1 responses", first.replace(mask=jnp.zeros_like(first.mask).at[:, 3].set(True))),
      ("bf16 inputs", _replace_token_fields(second, lambda x: x.astype(jnp.bfloat16))
       .replace(rewards=second.rewards.astype(jnp.bfloat16))),
      ("very negative log-probs", first.replace(
          behaviour_logprobs=first.behaviour_logprobs - 60.0,
          old_logprobs=first.old_logprobs - 60.0, ref_logprobs=first.ref_logprobs - 60.0,
          extras={**first.extras, "target_logprobs": first.extras["target_logprobs"] - 60.0})),
      ("near-zero log-probs", second.replace(
          behaviour_logprobs=jnp.full_like(second.behaviour_logprobs, -1e-7),
          old_logprobs=jnp.full_like(second.behaviour_logprobs, -1e-7),
          ref_logprobs=jnp.full_like(second.behaviour_logprobs, -1e-7))),
      ("huge rewards", second.replace(rewards=(2.0 * second.rewards - 1.0) * HUGE_REWARD)),
      ("large log-ratios", first.replace(extras={
          **first.extras,
          "target_logprobs": first.behaviour_logprobs
                             + _alternating(first.shape, LARGE_LOG_RATIO)})),
  ]
  if 1 in group_sizes:
    cases.append(("groups of size 1", base(1)))
  return [(f"{case} (G={r.group_size})", r) for case, r in cases]


def _on_random_rollouts(check: Callable[[Rollout], None], max_examples: int, group_sizes) -> None:
  """Runs `check` on hypothesis-drawn rollouts; hypothesis shrinks a failing one."""
  settings(max_examples=max_examples, deadline=None, derandomize=True,
           suppress_health_check=list(HealthCheck))(
      given(strategies.rollouts(group_sizes=group_sizes))(check))()


def _as_estimate(out) -> Estimate:
  return out if isinstance(out, Estimate) else Estimate(advantages=out)


def _float_leaves(rollout: Rollout):
  leaves, treedef = jax.tree.flatten(rollout)
  is_float = [jnp.issubdtype(x.dtype, jnp.floating) for x in leaves]
  return leaves, treedef, is_float


def _estimate_and_gradients(fn: Callable) -> Callable[[Rollout], tuple[Estimate, list]]:
  """One jitted program (one compile per shape): rollout -> (fn's estimate, float32 gradients
  of sum(w * advantages) w.r.t. its float leaves), w = 1 + cos(flat index) / 2: a VJP with
  every advantage weighted, finite whenever the Jacobian is (a sum of squares overflows on
  the huge-reward case)."""

  def gradients(rollout: Rollout):
    leaves, treedef, is_float = _float_leaves(rollout)

    def of_floats(floats):
      it = iter(floats)
      full = [next(it) if f else x for x, f in zip(leaves, is_float)]
      estimate = _as_estimate(fn(jax.tree.unflatten(treedef, full)))
      advantages = estimate.advantages.astype(jnp.float32)
      ramp = jnp.arange(advantages.size, dtype=jnp.float32).reshape(advantages.shape)
      weights = 1.0 + 0.5 * jnp.cos(ramp)
      return jnp.sum(weights * advantages)

    return jax.grad(of_floats)([x.astype(jnp.float32) for x, f in zip(leaves, is_float) if f])

  return jax.jit(lambda rollout: (_as_estimate(fn(rollout)), gradients(rollout)))


def _close(a, b, atol) -> bool:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return a.shape == b.shape and np.allclose(a, b, atol=atol, rtol=1e-4, equal_nan=False)


def _check_estimate_on(name, fn, evaluate, rollout, invariances, atol) -> Estimate:
  """The estimator's properties on one rollout, and its jitted estimate; `fn` None checks
  `evaluate`'s alone (jit == no-jit is checked on the degenerate rollouts)."""
  jit_estimate, gradients = evaluate(rollout)
  estimate = jit_estimate if fn is None else _as_estimate(fn(rollout))
  mask = np.asarray(rollout.mask, bool)
  outputs = {"advantages": estimate.advantages, "returns": estimate.returns}
  for key, value in outputs.items():
    if value is None:
      continue
    array = np.asarray(value.astype(jnp.float32) if value.dtype == jnp.bfloat16 else value,
                       np.float64)
    if value.shape != rollout.shape or not jnp.issubdtype(value.dtype, jnp.floating):
      _fail("shape", name, rollout,
            f"{key} has shape {value.shape} dtype {value.dtype}, want float {rollout.shape}")
    if not np.all(np.isfinite(array)):
      _fail("finite", name, rollout,
            f"{key} not finite at {_offending(array, ~np.isfinite(array))}")
    if np.any(array[~mask] != 0):
      _fail("masked_zero", name, rollout,
            f"{key} non-zero at masked {_offending(array, (~mask) & (array != 0))}")
  if fn is not None and not _close(jit_estimate.advantages, estimate.advantages, atol):
    _fail("jit", name, rollout, "jit and no-jit advantages differ")
  poisoned, _ = evaluate(poison_masked(rollout))
  if not _close(poisoned.advantages, jit_estimate.advantages, atol):
    _fail("masked_inputs_ignored", name, rollout,
          "NaN at masked input positions changed the advantages")
  for g in map(np.asarray, gradients):
    if not np.all(np.isfinite(g)):
      _fail("finite_gradients", name, rollout,
            f"gradient not finite at {_offending(g, ~np.isfinite(g))}")
  for inv_name, transform in invariances:
    changed, _ = evaluate(transform(rollout))
    if not _close(changed.advantages, jit_estimate.advantages, max(atol, 1e-3)):
      _fail(f"invariance:{inv_name}", name, rollout, "advantages changed under the transformation")
  return jit_estimate


def check_estimator(
    fn: Callable[[Rollout], Estimate | jax.Array],
    *,
    name: str | None = None,
    invariances: Iterable[Invariance] = (),
    vmap: bool = True,
    max_examples: int = 15,
    group_sizes: Sequence[int] = (1, 2, 4),
    atol: float = 1e-5,
) -> None:
  """Checks an estimator ``fn(rollout) -> Estimate | [B, T] advantages``.

  Properties: shape and float dtype; finite outputs; exactly 0 at masked positions; jit ==
  no-jit (on the degenerate rollouts: their one shape compiles each eager operation once);
  NaN at masked input positions changes nothing; finite gradients w.r.t. every float
  input; `vmap` over a stack of two rollouts equals two calls; each (name, transform) in
  `invariances` leaves the advantages unchanged. Runs on hypothesis-drawn rollouts and on
  `degenerate_rollouts()`.

  Args:
    fn: the estimator.
    name: its name in failure messages; by default ``fn.__name__``.
    invariances: ``(name, transform)`` pairs (`group_reward_shift`, `reward_scale`, ...).
    vmap: check vmap over a stack of two rollouts.
    max_examples: hypothesis-drawn rollouts.
    group_sizes: the group sizes drawn.
    atol: the tolerance of the equalities (1e-2 on bf16 inputs).

  Raises:
    ConformanceError: naming the property, the estimator and the input that broke it.
  """
  name = name or getattr(fn, "__name__", repr(fn))
  invariances = tuple(invariances)
  evaluate, batched_fn = _estimate_and_gradients(fn), jax.jit(jax.vmap(fn))
  for case, rollout in degenerate_rollouts(group_sizes):
    try:
      _check_estimate_on(name, fn, evaluate, rollout, invariances,
                         max(atol, 1e-2) if "bf16" in case else atol)
    except ConformanceError as error:
      raise ConformanceError(f"{error}\n(degenerate case: {case})") from None

  def check_random(rollout):
    alone = _check_estimate_on(name, None, evaluate, rollout, invariances, atol)
    if vmap:
      other = rollout.replace(rewards=rollout.rewards[::-1], values=-rollout.values)
      stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), rollout, other)
      batched = _as_estimate(batched_fn(stacked)).advantages
      for i, (single, estimate) in enumerate(((rollout, alone), (other, evaluate(other)[0]))):
        if not _close(batched[i], estimate.advantages, atol):
          _fail("vmap", name, single, f"vmap result {i} differs from a single call")

  _on_random_rollouts(check_random, max_examples, group_sizes)


def group_reward_shift(shift: float = 3.0) -> Invariance:
  """Invariance: adding a constant to each group's rewards, a different one per group
  (k * shift for group k), as group baselines must ignore.

  Args:
    shift: the step between groups' offsets.

  Returns:
    ``("group_reward_shift", transform)`` for `check_estimator`'s invariances.
  """

  def transform(rollout: Rollout) -> Rollout:
    offsets = shift * (jnp.arange(rollout.shape[0]) // rollout.group_size + 1)
    return rollout.replace(rewards=rollout.rewards + offsets.astype(rollout.rewards.dtype))

  return ("group_reward_shift", transform)


def reward_scale(scale: float = HUGE_REWARD) -> Invariance:
  """Invariance: multiplying every reward (outcome and dense) by `scale` > 0, as normalised
  advantages must ignore for any finite rewards.

  Args:
    scale: the factor, > 0.

  Returns:
    ``("reward_scale(<scale>)", transform)`` for `check_estimator`'s invariances.
  """

  def transform(rollout: Rollout) -> Rollout:
    token_rewards = None if rollout.token_rewards is None else rollout.token_rewards * scale
    return rollout.replace(rewards=rollout.rewards * scale, token_rewards=token_rewards)

  return (f"reward_scale({scale:g})", transform)


def _loss_inputs(rollout: Rollout, estimate_fn) -> tuple[PolicyOutputs, Estimate]:
  outputs = PolicyOutputs(
      logprobs=rollout.behaviour_logprobs
      + 0.05 * jnp.cos(jnp.arange(rollout.shape[1], dtype=jnp.float32)),
      entropy=rollout.entropy,
      values=rollout.values + 0.1,
  )
  return outputs, estimate_fn(rollout)


def _check_loss_on(name, fn, evaluate, rollout, estimate_fn, atol, on_policy=False,
                   log_ratio_shift=0.0):
  """The loss's properties on one rollout; `fn` None checks `evaluate`'s jitted loss alone."""
  outputs, estimate = _loss_inputs(rollout, estimate_fn)
  if on_policy:
    outputs = outputs._replace(logprobs=rollout.proximal_logprobs(by=name))
  if log_ratio_shift:  # log-ratios of +-shift or +-2 shift between the policy and the
    # behaviour, proximal and reference log-probs
    rollout = rollout.replace(behaviour_logprobs=rollout.behaviour_logprobs - log_ratio_shift,
                              old_logprobs=rollout.old_logprobs + log_ratio_shift
                              if rollout.old_logprobs is not None else None,
                              ref_logprobs=rollout.ref_logprobs + log_ratio_shift)
  # Without jit first where given: a loss that is not a scalar fails here, before grad does.
  (loss, metrics), grads = ((fn(outputs, rollout, estimate), None) if fn is not None
                            else evaluate(outputs, rollout, estimate))
  if jnp.shape(loss) != () or not np.isfinite(np.asarray(loss, np.float64)):
    _fail("scalar_finite_loss", name, rollout, f"loss = {loss!r}")
  for key, value in metrics.items():
    if jnp.shape(value) != () or not np.isfinite(np.asarray(value, np.float64)):
      _fail("finite_metrics", name, rollout, f"metric {key} = {value!r}")
  jit_loss = loss
  if fn is not None:
    (jit_loss, _), grads = evaluate(outputs, rollout, estimate)
    if not _close(jit_loss, loss, atol):
      _fail("jit", name, rollout, f"jit {jit_loss} != no-jit {loss}")
  poison = lambda x: None if x is None else jnp.where(rollout.mask, x, jnp.nan)
  (dirty_loss, _), _ = evaluate(jax.tree.map(poison, outputs), poison_masked(rollout), estimate)
  if not _close(dirty_loss, jit_loss, atol):
    _fail("masked_inputs_ignored", name, rollout,
          f"NaN at masked positions gave {dirty_loss} != {jit_loss}")
  mask = np.asarray(rollout.mask, bool)
  for field, g in zip(outputs._fields, grads):
    g = np.asarray(g, np.float64)
    if not np.all(np.isfinite(g)):
      _fail("finite_gradients", name, rollout,
            f"d loss / d outputs.{field} not finite at {_offending(g, ~np.isfinite(g))}")
    if np.any(g[~mask] != 0):
      _fail("masked_zero_gradients", name, rollout,
            f"d loss / d outputs.{field} non-zero at masked {_offending(g, (~mask) & (g != 0))}")


def check_loss(
    fn: Callable[..., tuple[jax.Array, dict]],
    *,
    name: str | None = None,
    estimate_fn: Callable[[Rollout], Estimate] | None = None,
    max_examples: int = 10,
    group_sizes: Sequence[int] = (1, 2, 4),
    atol: float = 1e-5,
) -> None:
  """Checks a loss ``fn(outputs, rollout, estimate) -> (scalar, metrics)``.

  Properties: scalar finite loss; finite scalar metrics; jit == no-jit (on the degenerate
  rollouts); NaN at masked
  positions of outputs and rollout changes nothing; gradients w.r.t. every outputs field
  finite and exactly 0 at masked positions. On random rollouts, on `degenerate_rollouts()`,
  on-policy (logp == old logp), and with log-ratios of +-100 to the behaviour and reference
  policies (exp overflows float32 there; a clip or `where` after it still leaves a NaN
  gradient).

  Args:
    fn: the loss, with the loss registry's signature.
    name: its name in failure messages; by default ``fn.__name__``.
    estimate_fn: the estimate the loss is given; None for GAE (advantages and returns).
    max_examples: hypothesis-drawn rollouts.
    group_sizes: the group sizes drawn.
    atol: the tolerance of the equalities.

  Raises:
    ConformanceError: naming the property, the loss and the input that broke it.
  """
  from jaxcredit import estimators  # the kit sits above both layers

  name = name or getattr(fn, "__name__", repr(fn))
  estimate_fn = jax.jit(estimate_fn or estimators.get("gae"))  # an input here, not under test
  evaluate = jax.jit(jax.value_and_grad(fn, has_aux=True))
  for case, rollout in degenerate_rollouts(group_sizes):
    if "bf16" in case or "huge rewards" in case:
      continue  # losses receive float32 policy outputs, and a value loss is legitimately (1e19)^2
    variants = [dict(on_policy=False), dict(on_policy=True)]
    if "large log-ratios" in case:
      variants = [dict(log_ratio_shift=s) for s in (LARGE_LOG_RATIO, -LARGE_LOG_RATIO)]
    for variant in variants:
      try:
        _check_loss_on(name, fn, evaluate, rollout, estimate_fn, atol, **variant)
      except ConformanceError as error:
        described = ", ".join(f"{k}={v}" for k, v in variant.items())
        raise ConformanceError(f"{error}\n(degenerate case: {case}, {described})") from None

  _on_random_rollouts(lambda r: _check_loss_on(name, None, evaluate, r, estimate_fn, atol),
                      max_examples, group_sizes)
