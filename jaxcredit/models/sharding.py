"""Placing model parameters and batches on a (data, fsdp, sequence, model) device mesh.

Every parameter has logical axis names (`logical_axes`); `rules` map logical
names to mesh axes. Dimensions that a mesh axis does not divide are
replicated, so the same code runs on 1 CPU, 8 fake devices or a pod slice.
The `sequence` axis shards teacher-forced rows along their length
(`jaxcredit.models.context_parallel`); parameters are replicated over it.
"""

from collections.abc import Mapping

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


def make_mesh(shape: tuple[int, int, int, int] | None = None) -> Mesh:
  """A (data, fsdp, sequence, model) mesh with automatic (GSPMD) sharding propagation.

  shape defaults to (all devices, 1, 1, 1): pure data parallelism. Run the
  model under `jax.set_mesh(mesh)` for the `sequence` axis to take effect.
  """
  shape = tuple(shape or (jax.device_count(), 1, 1, 1))
  check_mesh_shape(shape)
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def check_mesh_shape(shape) -> None:
  """ValueError unless `shape` gives a positive int size for each of MESH_AXES."""
  if len(shape) != len(MESH_AXES) or not all(isinstance(n, int) and n >= 1 for n in shape):
    raise ValueError(f"mesh.shape gives the sizes of (data, fsdp, sequence, model), e.g. "
                     f"(2, 2, 1, 2); got {tuple(shape)!r}.")


def logical_axes(path: tuple) -> tuple[str, ...]:
  """Logical axis names of the parameter at `path` in nnx.state(model, nnx.Param)
  (the stacked layers' parameters lead with "layers")."""
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
  """NamedShardings for nnx.state(model, nnx.Param), as a pure dict."""
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, _spec(x.shape, logical_axes(path), mesh, rules)), params
  )


def shard_model(model: nnx.Module, mesh: Mesh, rules: Mapping = DEFAULT_RULES) -> nnx.Module:
  """Moves the model's parameters onto the mesh in place; returns the model."""
  state = nnx.state(model, nnx.Param)
  params = jax.device_put(nnx.to_pure_dict(state), param_shardings(model, mesh, rules))
  nnx.replace_by_pure_dict(state, params)
  nnx.update(model, state)
  return model


def batch_sharding(mesh: Mesh, rules: Mapping = DEFAULT_RULES) -> NamedSharding:
  """Shards the leading (batch) axis over the mesh axes of the `batch` rule."""
  group = tuple(a for a in (rules.get("batch") or ()) if a in mesh.shape)
  return NamedSharding(mesh, PartitionSpec(group or None))
