"""Loading a Hugging Face-format safetensors checkpoint written here, offline."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

from jaxcredit.models import huggingface  # noqa: E402
from tests.unit.models.test_model import numpy_forward  # noqa: E402

HF_CONFIGS = {
    "qwen2": dict(model_type="qwen2", vocab_size=48, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "llama": dict(model_type="llama", vocab_size=40, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, intermediate_size=48,
                  rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  attention_bias=False),
}


def _random_checkpoint(hf):
  """HF-named float32 tensors: Linear weights are [out, in]."""
  rng = np.random.default_rng(0)
  d, ff, v = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
  hd = d // hf["num_attention_heads"]
  kv = hf["num_key_value_heads"] * hd
  bias = hf["model_type"] == "qwen2"
  w = lambda *shape: (0.1 * rng.normal(size=shape)).astype(np.float32)
  tensors = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": 1 + w(d)}
  if not hf["tie_word_embeddings"]:
    tensors["lm_head.weight"] = w(v, d)
  for i in range(hf["num_hidden_layers"]):
    p = f"model.layers.{i}."
    tensors.update({
        p + "input_layernorm.weight": 1 + w(d), p + "post_attention_layernorm.weight": 1 + w(d),
        p + "self_attn.q_proj.weight": w(d, d), p + "self_attn.k_proj.weight": w(kv, d),
        p + "self_attn.v_proj.weight": w(kv, d), p + "self_attn.o_proj.weight": w(d, d),
        p + "mlp.gate_proj.weight": w(ff, d), p + "mlp.up_proj.weight": w(ff, d),
        p + "mlp.down_proj.weight": w(d, ff),
    })
    if bias:
      tensors.update({p + "self_attn.q_proj.bias": w(d), p + "self_attn.k_proj.bias": w(kv),
                      p + "self_attn.v_proj.bias": w(kv)})
  return tensors


def _as_reference_params(tensors, hf):
  """Our parameter layout, built independently of the loader's name mapping."""
  linear = lambda name: {"kernel": tensors[name + ".weight"].T.astype(np.float64),
                         **({"bias": tensors[name + ".bias"]} if name + ".bias" in tensors else {})}
  layers = {}
  for i in range(hf["num_hidden_layers"]):
    p = f"model.layers.{i}."
    layers[i] = {
      "input_layernorm": {"weight": tensors[p + "input_layernorm.weight"]},
      "post_attention_layernorm": {"weight": tensors[p + "post_attention_layernorm.weight"]},
      "self_attn": {
        n: linear(p + "self_attn." + n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")
      },
      "mlp": {n: linear(p + "mlp." + n) for n in ("gate_proj", "up_proj", "down_proj")},
    }
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *layers.values())  # the model's layer axis
  params = {
    "embed_tokens": {"embedding": tensors["model.embed_tokens.weight"]},
    "norm": {"weight": tensors["model.norm.weight"]},
    "layers": stacked,
  }
  if "lm_head.weight" in tensors:
    params["lm_head"] = {"kernel": tensors["lm_head.weight"].T}
  return params


def _write(directory, hf, tensors, sharded=False):
  (directory / "config.json").write_text(json.dumps(hf))
  if not sharded:
    safetensors_numpy.save_file(tensors, directory / "model.safetensors")
    return
  names = sorted(tensors)
  halves = {
    "model-00001-of-00002.safetensors": names[::2],
    "model-00002-of-00002.safetensors": names[1::2],
  }
  weight_map = {}
  for shard, shard_names in halves.items():
    safetensors_numpy.save_file({n: tensors[n] for n in shard_names}, directory / shard)
    weight_map.update({n: shard for n in shard_names})
  (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize("flavour,sharded", [("qwen2", False), ("llama", True)])
def test_round_trip_matches_numpy_forward(tmp_path, flavour, sharded):
  hf = HF_CONFIGS[flavour]
  tensors = _random_checkpoint(hf)
  _write(tmp_path, hf, tensors, sharded)
  model = huggingface.load_hf_checkpoint(tmp_path)
  assert model.config.qkv_bias == (flavour == "qwen2")
  tokens = np.random.default_rng(1).integers(0, hf["vocab_size"], (2, 7))
  positions = np.broadcast_to(np.arange(7), (2, 7))
  want, _ = numpy_forward(
    _as_reference_params(tensors, hf), model.config, tokens, positions, np.ones((2, 7), bool)
  )
  np.testing.assert_allclose(model(jnp.asarray(tokens)).logits, want, atol=1e-4)


def test_bad_checkpoints_name_the_tensor(tmp_path):
  hf = HF_CONFIGS["qwen2"]
  tensors = _random_checkpoint(hf)
  missing = dict(tensors)
  del missing["model.layers.1.mlp.up_proj.weight"]
  _write(tmp_path, hf, missing)
  with pytest.raises(
    ValueError, match=r"missing tensor 'model.layers.1.mlp.up_proj.weight' \(shape \(32, 64\)\)"
  ):
    huggingface.load_hf_checkpoint(tmp_path)
  wrong = dict(tensors)
  wrong["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)
  _write(tmp_path, hf, wrong)
  with pytest.raises(
    ValueError,
    match=(r"'model.layers.0.self_attn.k_proj.weight' has shape \(8, 32\); "
           r"the config needs \(16, 32\)"),
  ):
    huggingface.load_hf_checkpoint(tmp_path)
  extra = {**tensors, "model.layers.2.mlp.up_proj.weight": np.zeros((64, 32), np.float32)}
  _write(tmp_path, hf, extra)
  with pytest.raises(
    ValueError, match="tensors the config does not use: \\['model.layers.2.mlp.up_proj.weight'\\]"
  ):
    huggingface.load_hf_checkpoint(tmp_path)
  (tmp_path / "config.json").unlink()
  with pytest.raises(ValueError, match="No config.json"):
    huggingface.load_hf_checkpoint(tmp_path)
  with pytest.raises(ValueError, match="Unsupported model_type 'gpt2'"):
    huggingface.config_from_hf({**hf, "model_type": "gpt2"})


def test_malformed_checkpoint_files_name_the_file(tmp_path):
  hf = HF_CONFIGS["qwen2"]
  tensors = _random_checkpoint(hf)
  _write(tmp_path, hf, tensors)
  weights = tmp_path / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # cut off mid-write
  with pytest.raises(
    ValueError, match=rf"Checkpoint file {re.escape(str(weights))} could not be read .*truncated"
  ):
    huggingface.load_hf_checkpoint(tmp_path)
  _write(tmp_path, {k: v for k, v in hf.items() if k != "hidden_size"}, tensors)
  with pytest.raises(
    ValueError, match=rf"{re.escape(str(tmp_path / 'config.json'))}: .*no 'hidden_size' field"
  ):
    huggingface.load_hf_checkpoint(tmp_path)
  (tmp_path / "config.json").write_text('{"hidden_size": 32,')
  with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
    huggingface.load_hf_checkpoint(tmp_path)
  _write(tmp_path, hf, tensors, sharded=True)
  (tmp_path / "model.safetensors.index.json").write_text('{"weights": {}}')
  with pytest.raises(ValueError, match=r"model.safetensors.index.json has no 'weight_map' field"):
    huggingface.load_hf_checkpoint(tmp_path)
