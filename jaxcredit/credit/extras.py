"""Extras providers: what an estimator declares it `needs`, computed before the learner step.

An estimator registered with `needs=("mc_values", "mc_evaluated")` reads those
rollout.extras; the provider registered for those keys computes them from the
sampled rollout. A provider is made once per run by its factory, from the
settings of the estimator that needs it (`estimators.Component.settings`)::

  @extras.register("ktae_scores")
  def _ktae(settings, *, temperature):
    def provide(context, rollout):       # -> (extras, metrics)
      return {"ktae_scores": ...}, {}
    return provide

The built-in providers are in `credit.providers` (imported with `jaxcredit.credit`).
Providers defined elsewhere (the lab's exact oracle) register themselves
when their module is imported; modules named in the "jaxcredit.extras"
entry-point group are imported when a needed key has no provider yet. A
"gen_tokens" metric is charged to the run's generated tokens.
"""

import importlib.metadata
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from jax import Array

from jaxcredit import estimators
from jaxcredit.registry import Registry
from jaxcredit.rollout import Rollout

ENTRY_POINTS = "jaxcredit.extras"


class Context(NamedTuple):
  """What a provider may read besides the rollout.

  Attributes:
    task: the run's `tasks.TrainTask`.
    model: the policy that sampled the rollout.
    examples: the task example of each row.
    key: a PRNG key for this step (shared by all providers).
    rl_step: the step index.
  """

  task: Any
  model: Any
  examples: list
  key: Array
  rl_step: int


Hook = Callable[[Context, Rollout], tuple[dict, dict]]
"""hook(context, rollout) -> (extras, metrics): a provider of rollout.extras, or a hook the
training loop runs after the providers, before the learner step (`loop.run(rollout_hook=)`):
`extras` are added to rollout.extras, `metrics` are logged under train/hook/ (a "gen_tokens"
entry is charged to the run's generated-token count). Hooks see whole batches."""
Factory = Callable[..., Hook]  # factory(settings: Mapping, *, temperature: float) -> Hook

PROVIDERS: Registry[Factory] = Registry("extras provider")
LAYOUTS = ("token", "sequence", "vector")  # [B, T], [B], [B, K]


def register(*keys: str, overwrite: bool = False,
             refuses: Callable[[Any], str | None] | None = None,
             per: str = "token") -> Callable[[Factory], Factory]:
  """Decorator registering a provider factory for the rollout.extras `keys` it computes.

  Args:
    *keys: the rollout.extras keys the factory's provider computes.
    overwrite: replace an earlier registration of a key.
    refuses: ``refuses(task) -> str | None``, why the provider cannot serve `task` (a
      `TrainTask`), or None when it can; `hook` asks it before any work.
    per: the extras' layout (`layout`): "token" ``[B, T]``, "sequence" ``[B]`` or
      "vector" ``[B, K]``.

  Returns:
    the decorator, which returns the factory unchanged.

  Raises:
    ValueError: when a key is registered already and `overwrite` is False, or on an
      unknown `per`.
  """
  if per not in LAYOUTS:
    raise ValueError(f"per must be one of {', '.join(LAYOUTS)}, got {per!r}.")

  def decorator(factory: Factory) -> Factory:
    for key in keys:
      PROVIDERS.register(key, overwrite=overwrite, refuses=refuses, per=per)(factory)
    return factory

  return decorator


def layout(key: str) -> str:
  """The layout of a provided extra.

  Args:
    key: a registered rollout.extras key.

  Returns:
    "token" (``[B, T]``), "sequence" (``[B]``) or "vector" (``[B, K]``).
  """
  return PROVIDERS.info(key)["per"]


Traceable = Callable[[Rollout, Array, int], dict]
"""traceable(rollout, key, vocab_size) -> extras: extras computed from the sampled rollout alone
(and a PRNG key), jit- and vmap-safe."""

TRACEABLE: Registry[Traceable] = Registry("traceable extras provider")


def register_traceable(*keys: str) -> Callable[[Traceable], Traceable]:
  """Decorator registering a traceable provider of the rollout.extras `keys`, and the host
  provider of those keys that runs it, so the training loop and the batched lab compute them
  with one function.

  The host provider runs the function compiled (`jax.jit`, the vocabulary size static: one
  program per batch shape, not one dispatch per operation), passing the step's key
  (`Context.key`) and the policy's vocabulary size; `jaxcredit.lab.batched` calls the function
  inside its compiled program.

  Args:
    *keys: the rollout.extras keys the function returns.

  Returns:
    the decorator, which returns the function unchanged.

  Raises:
    ValueError: when a key is registered already.

  Examples:
    >>> import jax
    >>> from jaxcredit import demo
    >>> from jaxcredit.credit import extras
    >>> @extras.register_traceable("row_lengths_example")
    ... def row_lengths(rollout, key, vocab_size):
    ...   return {"row_lengths_example": rollout.mask.sum(axis=1)}
    >>> extras.TRACEABLE.get("row_lengths_example")(demo.sample_rollout(), jax.random.key(0), 16)
    {'row_lengths_example': Array([3, 3, 4, 4, 3, 6, 4, 4], dtype=int32)}
    >>> extras.TRACEABLE.unregister("row_lengths_example")
    >>> extras.PROVIDERS.unregister("row_lengths_example")
  """

  def decorator(fn: Traceable) -> Traceable:
    compiled = jax.jit(fn, static_argnums=2)

    def provide(context: Context, rollout: Rollout) -> tuple[dict, dict]:
      return compiled(rollout, context.key, context.model.config.vocab_size), {}

    for key in keys:
      TRACEABLE.register(key)(fn)
    register(*keys)(lambda settings, *, temperature: provide)
    return fn

  return decorator


def _load_entry_points() -> None:
  for entry_point in importlib.metadata.entry_points(group=ENTRY_POINTS):
    entry_point.load()


def provider_factory(key: str, *, needed_by: str) -> Factory:
  """The factory registered for an extras key, importing the "jaxcredit.extras" entry-point
  modules if none is registered yet.

  Args:
    key: a rollout.extras key.
    needed_by: the estimator that needs it, for the error message.

  Returns:
    ``factory(settings, *, temperature) -> Hook``.

  Raises:
    ValueError: naming the estimator and the known keys when no provider computes `key`.
  """
  if key not in PROVIDERS:
    _load_entry_points()
  if key not in PROVIDERS:
    raise ValueError(
        f"Estimator {needed_by!r} needs rollout.extras[{key!r}], which no registered extras "
        f"provider computes; providers exist for: {', '.join(PROVIDERS.names())}.")
  return PROVIDERS.get(key)


def hook(advantage: estimators.compose.AdvantageFn, *, temperature: float = 1.0,
         task: Any = None) -> Hook | None:
  """One function computing every extra that an advantage function's estimators need.

  Each provider is made once, from the settings of the first estimator that needs it.

  Args:
    advantage: an advantage function (`estimators.from_config`, `estimators.component`).
    temperature: the sampling temperature, passed to every factory.
    task: the run's `TrainTask`, checked against each provider's `refuses`; None skips the
      check.

  Returns:
    a `Chain` of the providers, or None when the estimators need no extras.

  Raises:
    ValueError: at once for a key with no provider, or whose provider refuses `task`.
  """
  made: dict[Factory, Hook] = {}
  for component in estimators.components(advantage):
    for key in component.needs:
      factory = provider_factory(key, needed_by=component.name)
      refuses = PROVIDERS.info(key).get("refuses")
      reason = refuses(task) if task is not None and refuses is not None else None
      if reason:
        raise ValueError(f"Estimator {component.name!r} needs rollout.extras[{key!r}], which "
                         f"cannot be computed for task {task.name!r}: {reason}")
      if factory not in made:
        made[factory] = factory(component.settings, temperature=temperature)
  return chain(*made.values())


class Chain:
  """Hooks run in order, each seeing the extras of those before it; their extras and metrics
  merged.

  A hook that keeps learner state (PRIME's implicit PRM) has `start(policy)`, which the loop
  calls with the policy RL starts from, and `modules()`, the nnx modules and optimizers a
  checkpoint holds; `Chain` forwards both.

  Args:
    hooks: ``hook(context, rollout) -> (extras, metrics)``, in order.
  """

  def __init__(self, hooks: list[Hook]):
    self.hooks = hooks

  def __call__(self, context: Context, rollout: Rollout) -> tuple[dict, dict]:
    extras, metrics = {}, {}
    for hook in self.hooks:
      so_far = rollout.replace(extras={**rollout.extras, **extras})
      more_extras, more_metrics = hook(context, so_far)
      extras.update(more_extras)
      metrics.update(more_metrics)
    return extras, metrics

  def start(self, policy) -> None:
    """Starts every stateful hook's state from `policy`."""
    for hook in self.hooks:
      if hasattr(hook, "start"):
        hook.start(policy)

  def modules(self) -> dict:
    """{name: nnx module or optimizer} of every stateful hook (for checkpoints)."""
    return {name: module for hook in self.hooks if hasattr(hook, "modules")
            for name, module in hook.modules().items()}


def chain(*hooks: Hook | None) -> Chain | None:
  """Hooks run in order as one.

  Args:
    *hooks: hooks, or None entries (skipped).

  Returns:
    a `Chain`, or None when no hook is left.
  """
  hooks = [hook for hook in hooks if hook is not None]
  return Chain(hooks) if hooks else None
