"""Loading Hugging Face Llama / Qwen2 checkpoints (safetensors + config.json).

No network: point `load_hf_checkpoint` at a local directory holding
`config.json` and `model.safetensors` (or a sharded
`model.safetensors.index.json` with its shards). Needs the `safetensors`
package (`pip install jaxcredit[hf]`).
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit.models.config import TransformerConfig
from jaxcredit.models.transformer import Transformer

# Tensors some checkpoints carry that the model recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


HF_CONFIG_FIELDS = ("num_attention_heads", "vocab_size", "hidden_size", "num_hidden_layers",
                    "intermediate_size")
"""The `config.json` fields a checkpoint must have (the others have defaults)."""


def config_from_hf(hf_config: dict, **overrides) -> TransformerConfig:
  """A TransformerConfig from a Llama/Qwen2 `config.json` dict."""
  missing = [key for key in HF_CONFIG_FIELDS if key not in hf_config]
  if missing:
    raise ValueError(f"The model config has no {', '.join(map(repr, missing))} field.")
  model_type = hf_config.get("model_type", "llama")
  if model_type not in ("llama", "qwen2"):
    raise ValueError(f"Unsupported model_type {model_type!r}; supported: llama, qwen2.")
  n_heads = hf_config["num_attention_heads"]
  fields = dict(
      vocab_size=hf_config["vocab_size"],
      d_model=hf_config["hidden_size"],
      n_layers=hf_config["num_hidden_layers"],
      n_heads=n_heads,
      n_kv_heads=hf_config.get("num_key_value_heads", n_heads),
      d_ff=hf_config["intermediate_size"],
      head_dim=hf_config.get("head_dim"),
      rope_theta=float(hf_config.get("rope_theta", 10000.0)),
      norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
      qkv_bias=model_type == "qwen2" or bool(hf_config.get("attention_bias", False)),
      tie_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
  )
  return TransformerConfig(**{**fields, **overrides})


def _hf_name(path: tuple) -> tuple[str, bool]:
  """(Hugging Face tensor name, whether to transpose) of one of our parameters."""
  keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
  if keys[0] == "embed_tokens":
    return "model.embed_tokens.weight", False
  if keys[0] == "lm_head":
    return "lm_head.weight", True
  if keys[0] == "norm":
    return "model.norm.weight", False
  # layers / i / module / [proj] / kernel|bias|weight
  *modules, leaf = keys
  if leaf == "kernel":
    return "model." + ".".join(modules) + ".weight", True
  return "model." + ".".join(modules) + "." + leaf, False


def _read_tensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
  from safetensors.numpy import load_file  # optional dependency

  index = directory / "model.safetensors.index.json"
  if index.exists():
    shards = sorted(set(_read_json(index, required=("weight_map",))["weight_map"].values()))
  else:
    shards = ["model.safetensors"]
  tensors = {}
  for shard in shards:
    if not (directory / shard).exists():
      raise ValueError(f"Checkpoint file {directory / shard} is missing.")
    try:
      tensors.update(load_file(directory / shard))
    except Exception as error:  # safetensors raises its own SafetensorError without the file name
      raise ValueError(f"Checkpoint file {directory / shard} could not be read ({error}); "
                       "is it truncated or not safetensors?") from error
  return tensors


def _read_json(path: pathlib.Path, *, required: tuple[str, ...] = ()) -> dict:
  """A JSON object file; ValueError naming the file when it is malformed or lacks a
  `required` field."""
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
    raise ValueError(f"{path} is not valid JSON ({error}).") from None
  if not isinstance(data, dict):
    raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}.")
  missing = [key for key in required if key not in data]
  if missing:
    raise ValueError(f"{path} has no {', '.join(map(repr, missing))} field.")
  return data


def load_hf_checkpoint(path: str | pathlib.Path, **config_overrides) -> Transformer:
  """A Transformer with the weights of a local Llama/Qwen2 checkpoint.

  config_overrides (e.g. dtype=jnp.bfloat16, value_head=True) adjust the
  config read from config.json; a value head, absent from the checkpoint,
  starts at zero. Raises ValueError naming any missing, unexpected or
  mis-shaped tensor.
  """
  directory = pathlib.Path(path)
  config_file = directory / "config.json"
  if not config_file.exists():
    raise ValueError(f"No config.json in {directory}.")
  hf_config = _read_json(config_file)
  try:
    config = config_from_hf(hf_config, **config_overrides)
  except ValueError as error:
    raise ValueError(f"{config_file}: {error}") from None
  tensors = _read_tensors(directory)
  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  params = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
  used = set()

  def fill(path, spec):
    if str(getattr(path[0], "key", "")) == "value_head":
      return jnp.zeros(spec.shape, spec.dtype)
    name, transpose = _hf_name(path)
    if name not in tensors:
      raise ValueError(f"Checkpoint {directory} is missing tensor {name!r} (shape {spec.shape}).")
    value = tensors[name].T if transpose else tensors[name]
    if value.shape != spec.shape:
      raise ValueError(
          f"Tensor {name!r} has shape {tensors[name].shape}; the config needs "
          f"{spec.shape[::-1] if transpose else spec.shape}."
      )
    used.add(name)
    return jnp.asarray(value, spec.dtype)

  params = jax.tree_util.tree_map_with_path(fill, params)
  unexpected = sorted(n for n in set(tensors) - used if not n.endswith(_IGNORED_SUFFIXES))
  if unexpected:
    raise ValueError(
        f"Checkpoint {directory} has tensors the config does not use: {unexpected[:5]}.")
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)
