"""Loading Hugging Face Llama 3 / Qwen2 / Qwen3 checkpoints (safetensors + config.json).

No network: point `load_hf_checkpoint` at a local directory holding
`config.json` and `model.safetensors` (or a sharded
`model.safetensors.index.json` with its shards). Needs the `safetensors`
package (`pip install jaxcredit[hf]`).

Both config formats are read: `rope_parameters` (transformers >= 5) and the
older top-level `rope_theta` / `rope_scaling`. A field that would change the
computation in a way this model does not implement (another RoPE type,
sliding-window attention, another activation, biases the model lacks) raises
ValueError naming it: a checkpoint loads exactly or not at all.
"""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcredit.atomic import write_atomically
from jaxcredit.models.config import RopeScaling, TransformerConfig
from jaxcredit.models.transformer import Transformer

# Tensors some checkpoints carry that the model recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


HF_CONFIG_FIELDS = ("num_attention_heads", "vocab_size", "hidden_size", "num_hidden_layers",
                    "intermediate_size")
"""The `config.json` fields a checkpoint must have (the others have defaults)."""


MODEL_TYPES = ("llama", "qwen2", "qwen3")
ROPE_TYPES = ("default", "llama3")


def config_from_hf(hf_config: dict, **overrides) -> TransformerConfig:
  """A `TransformerConfig` from a Llama, Qwen2 or Qwen3 ``config.json`` dict.

  Args:
    hf_config: the parsed config.json.
    **overrides: `TransformerConfig` fields to replace (e.g. dtype, value_head).

  Returns:
    a `TransformerConfig`.

  Raises:
    ValueError: naming the field for a missing required field, an unknown model_type, or
      any setting the model does not implement.
  """
  missing = [key for key in HF_CONFIG_FIELDS if key not in hf_config]
  if missing:
    raise ValueError(f"The model config has no {', '.join(map(repr, missing))} field.")
  model_type = hf_config.get("model_type", "llama")
  if model_type not in MODEL_TYPES:
    raise ValueError(f"Unsupported model_type {model_type!r}; supported: {', '.join(MODEL_TYPES)}.")
  _refuse_unimplemented(hf_config, model_type)
  rope_theta, rope_scaling = _rope_settings(hf_config)
  n_heads = hf_config["num_attention_heads"]
  fields = dict(
      vocab_size=hf_config["vocab_size"],
      d_model=hf_config["hidden_size"],
      n_layers=hf_config["num_hidden_layers"],
      n_heads=n_heads,
      n_kv_heads=hf_config.get("num_key_value_heads") or n_heads,
      d_ff=hf_config["intermediate_size"],
      head_dim=hf_config.get("head_dim"),
      rope_theta=rope_theta,
      rope_scaling=rope_scaling,
      norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
      qkv_bias=model_type == "qwen2",
      qk_norm=model_type == "qwen3",
      tie_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
      max_position=hf_config.get("max_position_embeddings"),
  )
  return TransformerConfig(**{**fields, **overrides})


def _refuse_unimplemented(hf_config: dict, model_type: str) -> None:
  """ValueError naming the first field whose value changes the computation in a
  way the model does not implement."""
  layer_types = hf_config.get("layer_types") or []
  checks = [
      ("hidden_act", hf_config.get("hidden_act", "silu") == "silu",
       "only silu (SwiGLU) is implemented"),
      ("use_sliding_window", not hf_config.get("use_sliding_window", False),
       "sliding-window attention is not implemented"),
      ("layer_types", all(kind == "full_attention" for kind in layer_types),
       "only full_attention layers are implemented"),
      ("partial_rotary_factor", hf_config.get("partial_rotary_factor", 1.0) == 1.0,
       "RoPE over part of each head is not implemented"),
      ("mlp_bias", not hf_config.get("mlp_bias", False), "MLP biases are not implemented"),
      # Qwen2's q/k/v biases are fixed by its architecture; elsewhere this adds o_proj's too.
      ("attention_bias", model_type == "qwen2" or not hf_config.get("attention_bias", False),
       "attention biases (with an o_proj bias) are not implemented"),
  ]
  for field, ok, why in checks:
    if not ok:
      raise ValueError(f"{field} = {hf_config[field]!r}: {why}.")


def _rope_settings(hf_config: dict) -> tuple[float, RopeScaling | None]:
  """(rope_theta, rope_scaling) from `rope_parameters` or from the older
  top-level `rope_theta` and `rope_scaling` (whose type key may be "type")."""
  parameters = hf_config.get("rope_parameters")
  field = "rope_parameters" if parameters else "rope_scaling"
  spec = parameters or hf_config.get("rope_scaling") or {}
  if not isinstance(spec, dict):
    raise ValueError(f"{field} must be an object, got {spec!r}.")
  theta = float(spec.get("rope_theta", hf_config.get("rope_theta", 10000.0)))
  kind = spec.get("rope_type", spec.get("type", "default"))
  if kind not in ROPE_TYPES:
    raise ValueError(f"{field}: RoPE type {kind!r} is not implemented; implemented: "
                     f"{', '.join(ROPE_TYPES)}.")
  if kind == "default":
    return theta, None
  names = [f.name for f in dataclasses.fields(RopeScaling)]
  missing = [name for name in names if name not in spec]
  if missing:
    raise ValueError(f"{field}: llama3 RoPE needs {', '.join(map(repr, missing))}.")
  return theta, RopeScaling(**{name: spec[name] for name in names})


def stop_tokens(path: str | pathlib.Path) -> tuple[int, ...]:
  """A checkpoint's EOS ids: ``eos_token_id`` (an id or a list) of generation_config.json, else
  of config.json.

  Args:
    path: a checkpoint directory.

  Returns:
    the ids; () when neither file has one.
  """
  directory = pathlib.Path(path)
  for name in ("generation_config.json", "config.json"):
    if (directory / name).exists():
      eos = _read_json(directory / name).get("eos_token_id")
      if eos is not None:
        return tuple(int(i) for i in (eos if isinstance(eos, list) else [eos]))
  return ()


def _is_value_head(path: tuple) -> bool:
  """Whether a parameter path is the critic's value head (no transformers counterpart)."""
  return str(getattr(path[0], "key", "")) == "value_head"


def _hf_names(path: tuple, n_layers: int) -> tuple[list[str], bool]:
  """(Hugging Face tensor names, whether to transpose) of one of our parameters:
  one name, or one per layer (`model.layers.{i}...`) for the stacked layers'."""
  keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
  if keys[0] == "embed_tokens":
    return ["model.embed_tokens.weight"], False
  if keys[0] == "lm_head":
    return ["lm_head.weight"], True
  if keys[0] == "norm":
    return ["model.norm.weight"], False
  # layers / module / [proj] / kernel|bias|weight
  *modules, leaf = keys[1:]
  suffix = ".".join(modules) + (".weight" if leaf == "kernel" else f".{leaf}")
  return [f"model.layers.{i}.{suffix}" for i in range(n_layers)], leaf == "kernel"


def _is_stacked(path: tuple) -> bool:
  return str(getattr(path[0], "key", "")) == "layers"


class _Tensors:
  """The tensors of a checkpoint directory by name, each read when asked for
  (bfloat16 included), from `model.safetensors` or the shards of
  `model.safetensors.index.json`."""

  def __init__(self, directory: pathlib.Path):
    from safetensors import safe_open  # optional dependency

    index = directory / "model.safetensors.index.json"
    if index.exists():
      shards = sorted(set(_read_json(index, required=("weight_map",))["weight_map"].values()))
    else:
      shards = ["model.safetensors"]
    self.files = {}
    for shard in shards:
      path = directory / shard
      if not path.exists():
        raise ValueError(f"Checkpoint file {path} is missing.")
      try:
        handle = safe_open(str(path), framework="flax")
      except Exception as error:  # safetensors' own error does not name the file
        raise ValueError(f"Checkpoint file {path} could not be read ({error}); "
                         "is it truncated or not safetensors?") from error
      self.files.update({name: (path, handle) for name in handle.keys()})

  def __contains__(self, name: str) -> bool:
    return name in self.files

  def names(self) -> set[str]:
    return set(self.files)

  def read(self, name: str) -> tuple[jax.Array, pathlib.Path]:
    path, handle = self.files[name]
    try:
      return handle.get_tensor(name), path
    except Exception as error:
      raise ValueError(f"Tensor {name!r} of {path} could not be read ({error}).") from error


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


def read_config(path: str | pathlib.Path, **overrides) -> TransformerConfig:
  """The `TransformerConfig` of a checkpoint directory's config.json (`config_from_hf`), e.g.
  to build the architecture with random weights.

  Args:
    path: a checkpoint directory.
    **overrides: `TransformerConfig` fields to replace.

  Returns:
    a `TransformerConfig`.

  Raises:
    ValueError: naming the file when it is missing, malformed or unsupported.
  """
  config_file = pathlib.Path(path) / "config.json"
  if not config_file.exists():
    raise ValueError(f"No config.json in {pathlib.Path(path)}.")
  try:
    return config_from_hf(_read_json(config_file), **overrides)
  except ValueError as error:
    raise ValueError(f"{config_file}: {error}") from None


def load_hf_checkpoint(path: str | pathlib.Path, **config_overrides) -> Transformer:
  """A `Transformer` with the weights of a local Llama 3, Qwen2 or Qwen3 checkpoint.

  Args:
    path: a transformers checkpoint directory (config.json and model.safetensors, or its
      shards and index).
    **config_overrides: adjust the config read from config.json (e.g.
      ``dtype=jnp.bfloat16``, ``value_head=True``; a value head, absent from the
      checkpoint, starts at zero).

  Returns:
    the `Transformer`.

  Raises:
    ValueError: naming any missing, unexpected or mis-shaped tensor, or a bad config.
  """
  directory = pathlib.Path(path)
  config = read_config(directory, **config_overrides)
  tensors = _Tensors(directory)
  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  params = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
  used = set()

  def read(name, shape, transpose, dtype):
    if name not in tensors:
      raise ValueError(f"Checkpoint {directory} is missing tensor {name!r} (shape {shape}).")
    stored, file = tensors.read(name)
    if not jnp.issubdtype(stored.dtype, jnp.floating):
      raise ValueError(f"Tensor {name!r} of {file} has dtype {stored.dtype}; the model needs "
                       "floating-point weights.")
    value = stored.T if transpose else stored
    if value.shape != shape:
      raise ValueError(f"Tensor {name!r} has shape {stored.shape}; the config needs "
                       f"{shape[::-1] if transpose else shape} ({file}).")
    used.add(name)
    return jnp.asarray(value, dtype)

  def fill(path, spec):
    if _is_value_head(path):
      return jnp.zeros(spec.shape, spec.dtype)
    names, transpose = _hf_names(path, config.n_layers)
    if not _is_stacked(path):
      return read(names[0], spec.shape, transpose, spec.dtype)
    return jnp.stack([read(name, spec.shape[1:], transpose, spec.dtype) for name in names])

  params = jax.tree_util.tree_map_with_path(fill, params)
  unexpected = sorted(n for n in tensors.names() - used if not n.endswith(_IGNORED_SUFFIXES))
  if unexpected:
    raise ValueError(
        f"Checkpoint {directory} has tensors the config does not use: {unexpected[:5]}.")
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


# Tokenizer files copied beside an exported checkpoint when their directory is given.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt",
                   "added_tokens.json")


def hf_config(config: TransformerConfig) -> dict:
  """The transformers ``config.json`` of a `TransformerConfig` (`config_from_hf`'s inverse):
  qk_norm -> qwen3, qkv_bias -> qwen2, otherwise llama.

  Args:
    config: a `TransformerConfig`.

  Returns:
    the config.json dict.

  Raises:
    ValueError: for a config no transformers architecture has (qkv biases and q/k norms).
  """
  if config.qk_norm and config.qkv_bias:
    raise ValueError("No transformers architecture has both qkv biases and q/k norms.")
  model_type = "qwen3" if config.qk_norm else "qwen2" if config.qkv_bias else "llama"
  architecture = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "llama": "LlamaForCausalLM"}[model_type]
  rope = {"rope_type": "default", "rope_theta": config.rope_theta}
  trained_range = 32768
  if config.rope_scaling is not None:
    rope = {**rope, "rope_type": "llama3", **dataclasses.asdict(config.rope_scaling)}
    scaling = config.rope_scaling
    trained_range = int(scaling.original_max_position_embeddings * scaling.factor)
  max_positions = config.max_position or trained_range
  return {
      "architectures": [architecture], "model_type": model_type,
      "vocab_size": config.vocab_size, "hidden_size": config.d_model,
      "intermediate_size": config.d_ff, "num_hidden_layers": config.n_layers,
      "num_attention_heads": config.n_heads, "num_key_value_heads": config.n_kv_heads,
      "head_dim": config.resolved_head_dim, "hidden_act": "silu",
      "rms_norm_eps": config.norm_eps, "rope_parameters": rope,
      "tie_word_embeddings": config.tie_embeddings, "max_position_embeddings": max_positions,
      "attention_bias": False, "dtype": jnp.dtype(config.param_dtype).name,
  }


def save_hf_checkpoint(model: Transformer, path: str | pathlib.Path, *,
                       tokenizer: str | pathlib.Path | None = None,
                       stop_tokens: tuple[int, ...] = ()) -> pathlib.Path:
  """Writes a model as a transformers checkpoint directory.

  The directory gets model.safetensors (the parameters in their stored dtype; the value
  head, if any, is left out), config.json (`hf_config`), generation_config.json with
  `stop_tokens` as its eos_token_id when given, and the `TOKENIZER_FILES` found in the
  `tokenizer` directory. Each file is written under a temporary name and renamed, so a file
  present is whole.

  Args:
    model: a `Transformer`.
    path: the directory to write (created if needed).
    tokenizer: a directory holding tokenizer files to copy, or None.
    stop_tokens: EOS ids for generation_config.json.

  Returns:
    the directory.
  """
  from safetensors.flax import save_file  # optional dependency

  directory = pathlib.Path(path)
  directory.mkdir(parents=True, exist_ok=True)
  tensors = {}
  for key_path, value in jax.tree_util.tree_leaves_with_path(
      nnx.to_pure_dict(nnx.state(model, nnx.Param))):
    if _is_value_head(key_path):
      continue
    names, transpose = _hf_names(key_path, model.config.n_layers)
    layers = list(value) if _is_stacked(key_path) else [value]
    tensors.update({name: jnp.asarray(x.T if transpose else x) for name, x in zip(names, layers)})
  files = {"config.json": json.dumps(hf_config(model.config), indent=2)}
  if stop_tokens:
    files["generation_config.json"] = json.dumps({"eos_token_id": list(stop_tokens)}, indent=2)
  if tokenizer is not None:
    source = pathlib.Path(tokenizer)
    found = [name for name in TOKENIZER_FILES if (source / name).exists()]
    if not found:
      raise ValueError(f"No tokenizer files ({', '.join(TOKENIZER_FILES)}) in {source}.")
    files.update({name: (source / name).read_bytes() for name in found})
  write_atomically(directory / "model.safetensors",
                   lambda temporary: save_file(tensors, str(temporary), metadata={"format": "pt"}))
  for name, content in files.items():
    data = content if isinstance(content, bytes) else content.encode()
    write_atomically(directory / name, lambda temporary: temporary.write_bytes(data))
  return directory

