"""Sequence (context) parallelism: [B, L] rows sharded along L over the mesh's
`sequence` axis, for episodes too long for one device.

Active inside `jax.set_mesh(mesh)` when the mesh has a `sequence` axis of
size N > 1 (`sequence_shards`); otherwise every function here is the identity
and costs nothing. Each device holds L / N consecutive positions of every
row. Embedding, norms, projections, RoPE, the MLP and the log-prob head are
token-local and run on the local slice (`over_sequence`); only attention
looks across slices.

Attention all-gathers keys and values (`sequence_sharded`): each device
gathers the full [B, KV, L, hd] keys and values of a layer, attends with its
own L / N queries (blockwise, so memory stays linear in L) and drops them;
the backward pass reduce-scatters their gradients (the transpose of the
all-gather). Why not ring attention (Liu et al., 2023): with grouped-query
attention the keys and values are small - 2 * KV * hd values per token, 256
for Qwen2.5-0.5B against a residual stream of D = 896 - so one gather per
layer costs less memory than the layer's own activations at N = 8 and needs
no collective inside the attention loop; a ring only pays off when the
gathered keys and values no longer fit. Queries are sliced contiguously, so
the causal mask leaves later slices more work; the blockwise kernel computes
every block, masked or not, so the load is even.
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

SEQUENCE = "sequence"


def sequence_shards() -> int:
  """The size of the `sequence` axis of the mesh set by `jax.set_mesh`.

  Returns:
    the axis size; 1 without a mesh or without the axis.
  """
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty else mesh.shape.get(SEQUENCE, 1)


def constrain(x: jax.Array, axis: int = 1) -> jax.Array:
  """An array sharded along one axis over the sequence axis (other axes left to the compiler).

  Args:
    x: any array.
    axis: the axis to shard.

  Returns:
    `x` with a sharding constraint; `x` itself when `sequence_shards()` is 1.
  """
  if sequence_shards() == 1:
    return x
  spec = [PartitionSpec.UNCONSTRAINED] * x.ndim
  spec[axis] = SEQUENCE
  return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def over_sequence(f: Callable, in_axes: Sequence[int | None], out_axes: int = 1) -> Callable:
  """A function run on each device's slice of its arguments along the sequence axis.

  A length that the axis does not divide is padded at the end (True for bool, 0 otherwise:
  positions after every real one, which causal attention never shows to a real query) and
  the outputs are cut back. Inside f, ``jax.lax.all_gather(x, SEQUENCE, ...)`` reaches the
  other slices.

  Args:
    f: a function of arrays.
    in_axes: for each argument, the axis that is sharded, or None (the argument is passed
      whole to every device).
    out_axes: the axis every output is sharded along.

  Returns:
    the sharded function (`f` itself when `sequence_shards()` is 1); it raises ValueError
    when the sharded arguments disagree in length.
  """
  shards = sequence_shards()
  if shards == 1:
    return f
  spec = lambda axis: PartitionSpec() if axis is None else PartitionSpec(*[None] * axis, SEQUENCE)
  mapped = jax.shard_map(f, in_specs=tuple(spec(a) for a in in_axes), out_specs=spec(out_axes),
                         axis_names={SEQUENCE}, check_vma=False)

  def run(*args):
    lengths = {a.shape[axis] for a, axis in zip(args, in_axes) if axis is not None}
    if len(lengths) != 1:
      raise ValueError(f"Arguments sharded along the sequence disagree in length: {lengths}.")
    length = lengths.pop()
    extra = -length % shards
    if extra:
      args = [a if axis is None else _pad(a, axis, extra) for a, axis in zip(args, in_axes)]
    out = mapped(*args)
    return jax.tree.map(lambda x: jax.lax.slice_in_dim(x, 0, length, axis=out_axes), out)

  return run


def _pad(x: jax.Array, axis: int, extra: int) -> jax.Array:
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, extra)
  return jnp.pad(x, pad, constant_values=True if x.dtype == jnp.bool_ else 0)


def sequence_sharded(attend: Callable) -> Callable:
  """An attention function over sequence-sharded rows: each device attends with its queries to
  the all-gathered keys and values (module docstring).

  Args:
    attend: ``attend(q, keys, values, query_slots, key_valid)`` with q ``[B, T, ...]``,
      keys and values ``[B, KV, T, hd]``, query_slots ``[T]`` and key_valid ``[B, T]``, T the
      full length.

  Returns:
    a function of the same signature (`attend` itself when `sequence_shards()` is 1).
  """
  if sequence_shards() == 1:
    return attend

  def local(q, keys, values, query_slots, key_valid):
    return attend(q, _gather(keys, 2), _gather(values, 2), query_slots, _gather(key_valid, 1))

  return over_sequence(local, in_axes=(1, 2, 2, 0, 1))


def _gather(x: jax.Array, axis: int) -> jax.Array:
  """The whole of x along `axis` (the sequence's, L) from each device's slice of L / N."""
  if jax.default_backend() == "cpu" and x.dtype == jnp.bfloat16:
    # XLA:CPU aborts compiling the bf16 reduce-scatter that transposes this gather in
    # a partially manual shard_map ("Invalid binary instruction opcode copy").
    return jax.lax.all_gather(x.astype(jnp.float32), SEQUENCE, axis=axis,
                              tiled=True).astype(x.dtype)
  return jax.lax.all_gather(x, SEQUENCE, axis=axis, tiled=True)
