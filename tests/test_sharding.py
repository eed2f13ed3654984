"""Sharded forward on 8 forced CPU devices equals the single-device forward."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
from flax import nnx

from jaxcredit.models import Transformer, preset, sharding

ROOT = pathlib.Path(__file__).parent.parent

SCRIPT = """
import json
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jaxcredit.models import Transformer, preset, sharding

cfg = preset("tiny", tie_embeddings=False, qkv_bias=True, value_head=True)
model = Transformer(cfg, rngs=nnx.Rngs(0))
state = nnx.state(model, nnx.Param)
nnx.update(model, jax.tree.map(lambda x: x + 0.01, state))  # non-zero value head
tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (8, 12)))
forward = jax.jit(lambda m, t: m(t))
single = forward(model, tokens)
mesh = sharding.make_mesh((2, 2, 2))
sharding.shard_model(model, mesh)
multi = forward(model, jax.device_put(tokens, sharding.batch_sharding(mesh)))
print(json.dumps({
    "devices": len(jax.devices()),
    "gate_spec": str(model.layers.mlp.gate_proj.kernel[...].sharding.spec),
    "embed_spec": str(model.embed_tokens.embedding[...].sharding.spec),
    "logits_diff": float(jnp.max(jnp.abs(multi.logits - single.logits))),
    "values_diff": float(jnp.max(jnp.abs(multi.values - single.values))),
}))
"""


def test_eight_device_forward_equals_one_device():
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PYTHONPATH": str(ROOT)}
  result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["devices"] == 8
  assert report["gate_spec"] == "P(None, 'fsdp', 'model')"  # stacked layers: [n_layers, D, F]
  assert report["embed_spec"] == "P('model', 'fsdp')"
  # Tolerance: float32 reductions split across devices change summation order.
  assert report["logits_diff"] < 1e-4 and report["values_diff"] < 1e-4, report


def test_specs_replicate_what_a_mesh_axis_does_not_divide():
  mesh = sharding.make_mesh((1, 1, 1))
  model = Transformer(preset("tiny"), rngs=nnx.Rngs(0))
  specs = sharding.param_shardings(model, mesh)
  assert specs["layers"]["self_attn"]["q_proj"]["kernel"].spec == jax.sharding.PartitionSpec(
      None, "fsdp", "model")
  assert specs["norm"]["weight"].spec == jax.sharding.PartitionSpec(None)
  fake = type("FakeMesh", (), {"shape": {"data": 1, "fsdp": 3, "model": 1}})()
  assert sharding._spec((128, 64), ("embed", "mlp"), fake, sharding.DEFAULT_RULES) == \
      jax.sharding.PartitionSpec(None, "model")
  np.testing.assert_equal(len(jax.tree.leaves(specs)), len(jax.tree.leaves(nnx.state(model, nnx.Param))))
