"""Name -> function registries, so configs select estimators and losses by string."""

from collections.abc import Callable
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
  """A mapping from names to functions of one kind, filled with a decorator.

  Args:
    kind: what is registered, for error messages (e.g. "estimator").
    wrap: ``wrap(name, fn) -> fn``, applied to each function as it is registered.

  Examples:
    >>> advantages = Registry("estimator")
    >>> @advantages.register("zero")
    ... def zero(rollout): ...
    >>> advantages.names()
    ['zero']
  """

  def __init__(self, kind: str, wrap: Callable[[str, F], F] = lambda name, fn: fn):
    self.kind = kind
    self._wrap = wrap
    self._items: dict[str, F] = {}
    self._info: dict[str, dict[str, Any]] = {}

  def register(self, name: str, *, overwrite: bool = False, **info: Any) -> Callable[[F], F]:
    """Decorator that registers a function under `name`.

    Args:
      name: a non-empty string.
      overwrite: replace an earlier registration of `name` instead of refusing it.
      **info: what the kind of registry records about the function (e.g. an estimator's
        `needs`), read back with `info`.

    Returns:
      The decorator; it returns the function unchanged.

    Raises:
      ValueError: for an empty name, or a name already registered without `overwrite`.
    """
    if not isinstance(name, str) or not name:
      raise ValueError(f"A {self.kind} name must be a non-empty string, got {name!r}.")

    def decorator(fn: F) -> F:
      if name in self._items and not overwrite:
        raise ValueError(
            f"{self.kind} {name!r} is already registered; pass overwrite=True "
            "to replace it."
        )
      self._items[name] = self._wrap(name, fn)
      self._info[name] = info
      return fn

    return decorator

  def get(self, name: str) -> F:
    """The registered function called `name` (as the registry's `wrap` adapted it).

    Args:
      name: a registered name (`names()` lists them).

    Returns:
      The function.

    Raises:
      ValueError: for an unknown name, listing the known ones.

    Examples:
      >>> import jax.numpy as jnp
      >>> import jaxcredit as jc
      >>> rollout = jc.Rollout(tokens=jnp.zeros((2, 3), jnp.int32), mask=jnp.ones((2, 3), bool),
      ...                      rewards=jnp.array([1.0, 0.0]), group_size=2)
      >>> jc.estimators.get("rloo")(rollout).advantages
      Array([[ 1.,  1.,  1.],
             [-1., -1., -1.]], dtype=float32)
    """
    try:
      return self._items[name]
    except (KeyError, TypeError):
      raise ValueError(
          f"Unknown {self.kind} {name!r}; known: {', '.join(self.names())}."
      ) from None

  def info(self, name: str) -> dict[str, Any]:
    """What was registered with `name` besides the function (ValueError if unknown)."""
    self.get(name)
    return self._info[name]

  def unregister(self, name: str) -> None:
    """Removes `name` (e.g. a test's temporary registration)."""
    self.get(name)
    del self._items[name], self._info[name]

  def names(self) -> list[str]:
    return sorted(self._items)

  def __contains__(self, name: str) -> bool:
    return name in self._items
