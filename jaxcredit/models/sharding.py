"""Placing model parameters and batches on a (data, fsdp, sequence, model) device mesh.

Every parameter has logical axis names (`logical_axes`); `rules` map logical
names to mesh axes. Dimensions that a mesh axis does not divide are
replicated, so the same code runs on 1 CPU, 8 fake devices or a pod slice.
The `sequence` axis shards teacher-forced rows along their length
(`jaxcredit.models.context_parallel`); parameters are replicated over it.
"""

import functools
import math
from collections.abc import Callable, Mapping

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "sequence", "model")

# Logical axis -> mesh axis (or tuple of mesh axes, or None = replicated).
DEFAULT_RULES: Mapping[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "vocab": "model",
    "embed": "fsdp",
    "heads": "model",
    "mlp": "model",
    "norm": None,
    "out": None,
    "layers": None,  # the stacked layer axis: every device holds its slice of every layer
}


def make_mesh(shape: tuple[int, int, int, int] | None = None, devices=None) -> Mesh:
  """A (data, fsdp, sequence, model) mesh with automatic (GSPMD) sharding propagation.

  Run the model under ``jax.set_mesh(mesh)`` for the `sequence` axis to take effect.

  Args:
    shape: the four axis sizes; None for ``(len(devices), 1, 1, 1)``, pure data parallelism.
    devices: the devices, by default the first ``prod(shape)`` of all.

  Returns:
    a `jax.sharding.Mesh` with axes `MESH_AXES`.

  Raises:
    ValueError: unless `shape` gives a positive int size for each axis.

  Examples:
    >>> from jaxcredit.models import sharding
    >>> dict(sharding.make_mesh((1, 1, 1, 1)).shape)
    {'data': 1, 'fsdp': 1, 'sequence': 1, 'model': 1}
  """
  shape = tuple(shape or (len(jax.devices() if devices is None else devices), 1, 1, 1))
  check_mesh_shape(shape)
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def split_meshes(learner_shape, sampler_shape) -> tuple[Mesh, Mesh]:
  """A learner mesh and a sampler mesh on disjoint devices.

  The learner's are the first ``prod(learner_shape)`` devices, the sampler's the rest;
  together they must use every device (`mesh.shape` and `mesh.sampler_shape` name the two
  in a config). On one process only: a multi-host sampler split needs a per-host split of
  the devices.

  Args:
    learner_shape: the learner mesh's four axis sizes, or None for the devices the sampler
      leaves, data-parallel.
    sampler_shape: the sampler mesh's four axis sizes.

  Returns:
    ``(learner_mesh, sampler_mesh)``.

  Raises:
    ValueError: on a bad shape, when the two do not split the devices, or on several
      processes.
  """
  check_mesh_shape(sampler_shape, field="mesh.sampler_shape")
  devices, sampled = jax.devices(), math.prod(sampler_shape)
  learner_shape = tuple(learner_shape or (len(devices) - sampled, 1, 1, 1))
  if jax.process_count() > 1:
    raise ValueError("mesh.sampler_shape splits one process's devices; it is not supported on "
                     f"{jax.process_count()} processes.")
  if min(learner_shape) < 1 or math.prod(learner_shape) + sampled != len(devices):
    raise ValueError(
        f"mesh.shape {learner_shape} (learner, {math.prod(learner_shape)} devices) and "
        f"mesh.sampler_shape {tuple(sampler_shape)} ({sampled} devices) must split the "
        f"{len(devices)} devices between them.")
  learned = math.prod(learner_shape)
  return make_mesh(learner_shape, devices[:learned]), make_mesh(sampler_shape, devices[learned:])


def check_mesh_shape(shape, field: str = "mesh.shape") -> None:
  """Checks a mesh shape.

  Args:
    shape: the sizes of (data, fsdp, sequence, model).
    field: the config field it came from, for the error message.

  Raises:
    ValueError: unless `shape` gives a positive int size for each of `MESH_AXES`.
  """
  if len(shape) != len(MESH_AXES) or not all(isinstance(n, int) and n >= 1 for n in shape):
    raise ValueError(f"{field} gives the sizes of (data, fsdp, sequence, model), e.g. "
                     f"(2, 2, 1, 2); got {tuple(shape)!r}.")


def logical_axes(path: tuple) -> tuple[str, ...]:
  """The logical axis names of a parameter.

  Args:
    path: the parameter's key path in ``nnx.state(model, nnx.Param)``.

  Returns:
    one name per dimension (the stacked layers' parameters lead with "layers").

  Raises:
    ValueError: for a parameter the model does not have.
  """
  keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
  if keys[0] == "layers":
    return ("layers", *_axes(keys))
  return _axes(keys)


def _axes(keys: list[str]) -> tuple[str, ...]:
  name, leaf = keys[-2], keys[-1]
  if keys[0] == "embed_tokens":
    return ("vocab", "embed")
  if keys[0] == "lm_head":
    return ("embed", "vocab")
  if keys[0] == "value_head":
    return ("embed", "out") if leaf == "kernel" else ("out",)
  if leaf == "weight":  # RMSNorm
    return ("norm",)
  if name in ("q_proj", "k_proj", "v_proj"):
    return ("embed", "heads") if leaf == "kernel" else ("heads",)
  if name == "o_proj":
    return ("heads", "embed")
  if name in ("gate_proj", "up_proj"):
    return ("embed", "mlp")
  if name == "down_proj":
    return ("mlp", "embed")
  raise ValueError(f"No logical axes for parameter {'/'.join(keys)}.")


def _spec(shape, names, mesh: Mesh, rules) -> PartitionSpec:
  axes = []
  for size, name in zip(shape, names):
    mesh_axes = rules.get(name)
    group = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes or ())
    group = tuple(a for a in group if a in mesh.shape)
    devices = 1
    for a in group:
      devices *= mesh.shape[a]
    axes.append(group if group and size % devices == 0 else None)
  return PartitionSpec(*[a[0] if isinstance(a, tuple) and len(a) == 1 else a for a in axes])


def param_shardings(model: nnx.Module, mesh: Mesh, rules: Mapping = DEFAULT_RULES):
  """The shardings of a model's parameters.

  Args:
    model: a `Transformer`.
    mesh: the device mesh.
    rules: logical axis name -> mesh axis, tuple of mesh axes, or None (replicated).

  Returns:
    a pure dict of `NamedSharding`, the structure of ``nnx.state(model, nnx.Param)``; a
    dimension that its mesh axes do not divide is replicated.
  """
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, _spec(x.shape, logical_axes(path), mesh, rules)), params
  )


def shard_model(model: nnx.Module, mesh: Mesh, rules: Mapping = DEFAULT_RULES) -> nnx.Module:
  """Moves the model's parameters onto the mesh, in place.

  Args:
    model: a `Transformer`.
    mesh: the device mesh.
    rules: logical axis name -> mesh axis, tuple of mesh axes, or None (replicated).

  Returns:
    the same model.
  """
  state = nnx.state(model, nnx.Param)
  params = jax.device_put(nnx.to_pure_dict(state), param_shardings(model, mesh, rules))
  nnx.replace_by_pure_dict(state, params)
  nnx.update(model, state)
  return model


def sharding_on(x: jax.Array, mesh: Mesh) -> NamedSharding:
  """An array's sharding on a mesh.

  Args:
    x: an array.
    mesh: the device mesh.

  Returns:
    x's sharding when it is a `NamedSharding` on `mesh`, else replicated on `mesh`.
  """
  placed = isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
  return x.sharding if placed else NamedSharding(mesh, PartitionSpec())


def place_state(modules, mesh: Mesh):
  """Puts every array of the modules' state that is not on `mesh` there, replicated, in place.

  Optimizer counters (Adam's count, nnx's step) start on one device while a step jitted
  under the mesh returns them replicated on it: without this, the second step's inputs
  differ in sharding and the step compiles again.

  Args:
    modules: nnx modules or optimizers (any pytree of them).
    mesh: the device mesh.

  Returns:
    `modules`.
  """
  nnx.update(modules, _on_mesh(nnx.state(modules), mesh))
  return modules


def _on_mesh(state, mesh: Mesh):
  """`state` with every array not on `mesh` put there, replicated; the others as they are."""
  def put(x):
    target = sharding_on(x, mesh)
    return x if target == x.sharding else jax.device_put(x, target)

  return jax.tree.map(put, state)


def jit_in_place(update: Callable, *, static_argnums: tuple[int, ...] = ()) -> Callable:
  """Compiles ``update(module, optimizer, *args) -> out``, which changes a module and its
  `nnx.Optimizer` in place (as under `nnx.jit`), so that their arrays come back in the
  shardings they came in.

  Left to XLA's propagation, an updated parameter placed replicated can come back sharded
  (and a replicated one as ``P()`` for ``P(None, None)``): the next call's inputs differ, and it
  and every program reading the parameters compile again. Arrays not yet on the mesh of the
  others (a fresh optimizer's count) are first placed there, replicated.

  Args:
    update: traceable; its first two arguments are the module and its optimizer.
    static_argnums: `update`'s static arguments (2 or more).

  Returns:
    ``step(module, optimizer, *args) -> out``, compiled once per placement of its inputs.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from flax import nnx
    >>> from jaxcredit.models import sharding
    >>> def update(model, optimizer, x):
    ...   loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    ...   optimizer.update(model, grads)
    ...   return loss
    >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    >>> step = sharding.jit_in_place(update)
    >>> bool(step(model, optimizer, jnp.ones((1, 2))) > step(model, optimizer, jnp.ones((1, 2))))
    True
  """
  compiled = {}

  def pure(graphdef, state, *args):
    module, optimizer = nnx.merge(graphdef, state)
    out = update(module, optimizer, *args)
    return nnx.state((module, optimizer)), out

  pure.__name__ = pure.__qualname__ = update.__name__  # the compiled program's name

  def step(module, optimizer, *args):
    modules = (module, optimizer)
    graphdef, state = nnx.split(modules)
    mesh = next((x.sharding.mesh for x in jax.tree.leaves(state)
                 if isinstance(x.sharding, NamedSharding)), None)
    shardings = key = None
    if mesh is not None:
      state = _on_mesh(state, mesh)
      shardings = jax.tree.map(lambda x: x.sharding, state)
      key = (jax.tree.structure(state), tuple(jax.tree.leaves(shardings)))
    if key not in compiled:
      compiled[key] = jax.jit(pure, static_argnums=(0, *static_argnums),
                              out_shardings=(shardings, None))
    state, out = compiled[key](graphdef, state, *args)
    nnx.update(modules, state)
    return out

  return functools.wraps(update)(step)


def batch_shards(batch: int, rules: Mapping = DEFAULT_RULES) -> int:
  """How many devices a ``[batch, ...]`` array's leading axis spans under the mesh set by
  `jax.set_mesh`.

  Args:
    batch: the leading axis's size.
    rules: logical axis name -> mesh axis, tuple of mesh axes, or None (replicated).

  Returns:
    the number of shards; 1 without a mesh, or when the batch rule's axes do not divide
    `batch`.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return 1
  shards = math.prod(mesh.shape[a] for a in _batch_axes(mesh, rules))
  return shards if batch % shards == 0 else 1


def _batch_axes(mesh, rules: Mapping) -> tuple[str, ...]:
  """The mesh axes of the `batch` rule that `mesh` has."""
  return tuple(a for a in (rules.get("batch") or ()) if a in mesh.shape)


def batch_sharding(mesh: Mesh, rules: Mapping = DEFAULT_RULES) -> NamedSharding:
  """Shards the leading (batch) axis over the mesh axes of the `batch` rule.

  Args:
    mesh: the device mesh.
    rules: logical axis name -> mesh axis, tuple of mesh axes, or None (replicated).

  Returns:
    a `NamedSharding`.
  """
  group = _batch_axes(mesh, rules)
  return NamedSharding(mesh, PartitionSpec(group or None))


def sampling_sharding(mesh: Mesh, rules: Mapping = DEFAULT_RULES) -> NamedSharding:
  """Shards sampled rows over the mesh axes of the `batch` rule and `sequence`.

  The learner splits a row's tokens over `sequence`; a decode step has one token per row, so
  when sampling those devices take rows of their own instead of each sampling every row.

  Args:
    mesh: the device mesh.
    rules: logical axis name -> mesh axis, tuple of mesh axes, or None (replicated).

  Returns:
    a `NamedSharding` of the leading (row) axis.
  """
  group = _batch_axes(mesh, rules) + tuple(
      a for a in ("sequence",) if mesh.shape.get(a, 1) > 1 and a not in _batch_axes(mesh, rules))
  return NamedSharding(mesh, PartitionSpec(group or None))
