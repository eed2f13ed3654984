"""Checkpoints written by `transformers` itself load to the logits `transformers` computes.

Small random models of every advertised architecture are built offline with
`transformers` (PyTorch, CPU), saved with `save_pretrained`, loaded with
`load_hf_checkpoint`, and compared in float32 over 2 x 128 positions.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxcredit.models import huggingface  # noqa: E402

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=512, initializer_range=0.1)
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64)
VARIANTS = {
    # Qwen2 / Qwen2.5: qkv bias, tied embeddings, a single KV head.
    "qwen2_tied_kv1": ("Qwen2Config", dict(num_key_value_heads=1, tie_word_embeddings=True,
                                           rope_theta=1e6, rms_norm_eps=1e-6)),
    "qwen2_untied_gqa": ("Qwen2Config", dict(num_key_value_heads=2, tie_word_embeddings=False,
                                             rope_theta=1e6, rms_norm_eps=1e-6)),
    # Qwen3: q/k RMSNorm, no qkv bias, head_dim 32 != hidden_size / heads = 16.
    "qwen3": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                                  rope_theta=1e6, rms_norm_eps=1e-6)),
    # Llama 3.x: llama3 RoPE scaling; wavelengths on both sides of the smoothed band.
    "llama3": ("LlamaConfig", dict(num_key_value_heads=2, tie_word_embeddings=True,
                                   rms_norm_eps=1e-5, rope_parameters=LLAMA3_ROPE)),
    "llama_untied": ("LlamaConfig", dict(num_key_value_heads=4, tie_word_embeddings=False,
                                         rms_norm_eps=1e-5, rope_theta=500000.0)),
}
TOKENS = np.random.default_rng(0).integers(0, SMALL["vocab_size"], (2, 128))


def _hf_model(variant: str, dtype=None):
  config_class, fields = VARIANTS[variant]
  config = getattr(transformers, config_class)(**SMALL, **fields)
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(config).eval()
  return model.to(dtype) if dtype is not None else model


def _hf_logits(model, tokens=TOKENS) -> np.ndarray:
  with torch.no_grad():
    return model(torch.as_tensor(tokens)).logits.float().numpy()


def _logits(directory, tokens=TOKENS, **overrides) -> np.ndarray:
  model = huggingface.load_hf_checkpoint(directory, **overrides)
  return np.asarray(model(jnp.asarray(tokens)).logits, np.float32)


def _relative_error(got, want) -> float:
  return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_float32_logits_equal_transformers(tmp_path, variant):
  model = _hf_model(variant)
  model.save_pretrained(tmp_path)
  assert _relative_error(_logits(tmp_path), _hf_logits(model)) <= 1e-5


def test_the_comparison_sees_a_wrong_rope(tmp_path):
  """A check that can fail: the llama3 model read without its RoPE scaling is off."""
  model = _hf_model("llama3")
  model.save_pretrained(tmp_path)
  config = huggingface.config_from_hf(json.loads((tmp_path / "config.json").read_text()))
  wrong = _logits(tmp_path, rope_scaling=None)
  assert config.rope_scaling is not None
  assert _relative_error(wrong, _hf_logits(model)) > 1e-3


@pytest.mark.parametrize("variant", ["llama3", "qwen2_tied_kv1"])
def test_the_older_config_format_reads_the_same(tmp_path, variant):
  """transformers 4.x wrote rope_theta and rope_scaling at the top level."""
  model = _hf_model(variant)
  model.save_pretrained(tmp_path)
  path = tmp_path / "config.json"
  config = json.loads(path.read_text())
  rope = config.pop("rope_parameters")
  config["rope_theta"] = rope.pop("rope_theta")
  if rope.pop("rope_type") != "default":
    config["rope_scaling"] = {"type": VARIANTS[variant][1]["rope_parameters"]["rope_type"], **rope}
  path.write_text(json.dumps(config))
  assert _relative_error(_logits(tmp_path), _hf_logits(model)) <= 1e-5


def test_bf16_checkpoints_load_exactly(tmp_path):
  model = _hf_model("qwen2_untied_gqa", torch.bfloat16)
  model.save_pretrained(tmp_path)
  # The bf16 weights computed in float32 (read back fresh: casting the model itself to bf16
  # and back would leave its RoPE frequencies rounded to bf16).
  reread = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
  want = _hf_logits(reread.eval())
  assert _relative_error(_logits(tmp_path), want) <= 1e-5
  loaded = huggingface.load_hf_checkpoint(tmp_path, param_dtype=jnp.bfloat16)
  embedding = loaded.embed_tokens.embedding[...]
  assert embedding.dtype == jnp.bfloat16
  np.testing.assert_array_equal(
      np.asarray(embedding, np.float32),
      model.model.embed_tokens.weight.detach().float().numpy())


def test_sharded_checkpoints_load(tmp_path):
  model = _hf_model("qwen3")
  model.save_pretrained(tmp_path, max_shard_size="100KB")
  assert (tmp_path / "model.safetensors.index.json").exists()
  assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
  assert _relative_error(_logits(tmp_path), _hf_logits(model)) <= 1e-5
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  (tmp_path / sorted(set(index["weight_map"].values()))[-1]).unlink()
  with pytest.raises(ValueError, match=r"model-.*\.safetensors.* is missing"):
    huggingface.load_hf_checkpoint(tmp_path)


def test_stop_tokens_come_from_generation_config(tmp_path):
  model = _hf_model("qwen2_tied_kv1")
  model.generation_config.eos_token_id = [5, 7]
  model.save_pretrained(tmp_path)
  assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == [5, 7]
  assert huggingface.stop_tokens(tmp_path) == (5, 7)
  (tmp_path / "generation_config.json").unlink()
  config = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps({**config, "eos_token_id": 3}))
  assert huggingface.stop_tokens(tmp_path) == (3,)


@pytest.mark.parametrize("field, value, named", [
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}, "yarn"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1e4}, "factor"),
    ("use_sliding_window", True, "use_sliding_window"),
    ("hidden_act", "gelu", "hidden_act"),
    ("attention_bias", True, "attention_bias"),
    ("partial_rotary_factor", 0.5, "partial_rotary_factor"),
    ("model_type", "mistral", "model_type"),
])
def test_unimplemented_fields_are_refused_by_name(tmp_path, field, value, named):
  model = _hf_model("llama_untied")
  model.save_pretrained(tmp_path)
  config = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
  with pytest.raises(ValueError, match=rf"config\.json.*{named}"):
    huggingface.load_hf_checkpoint(tmp_path)


def test_a_tensor_of_the_wrong_dtype_is_refused(tmp_path):
  from safetensors.numpy import load_file, save_file
  model = _hf_model("llama_untied")
  model.save_pretrained(tmp_path)
  tensors = load_file(tmp_path / "model.safetensors")
  tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.int32)
  save_file(tensors, tmp_path / "model.safetensors")
  with pytest.raises(ValueError, match=r"model\.norm\.weight.*int32"):
    huggingface.load_hf_checkpoint(tmp_path)


@pytest.mark.parametrize("variant", ["qwen2_untied_gqa", "qwen3", "llama3"])
def test_exported_policies_load_in_transformers_to_the_same_logits(tmp_path, variant):
  model = _hf_model(variant)
  model.save_pretrained(tmp_path / "original")
  ours = huggingface.load_hf_checkpoint(tmp_path / "original")
  (tmp_path / "tokenizer").mkdir()
  (tmp_path / "tokenizer" / "tokenizer_config.json").write_text('{"model_max_length": 512}')
  huggingface.save_hf_checkpoint(ours, tmp_path / "exported", tokenizer=tmp_path / "tokenizer",
                                stop_tokens=(3, 4))
  exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
  assert type(exported) is type(model)
  assert _relative_error(_hf_logits(exported), _hf_logits(model)) <= 1e-5
  assert exported.generation_config.eos_token_id == [3, 4]
  assert (tmp_path / "exported" / "tokenizer_config.json").exists()
  assert not list((tmp_path / "exported").glob(".*.tmp"))
  # And back: the exported directory loads here to the same parameters.
  again = huggingface.load_hf_checkpoint(tmp_path / "exported")
  resolved = lambda config: config.replace(head_dim=config.resolved_head_dim)
  assert resolved(again.config) == resolved(ours.config)
  np.testing.assert_array_equal(np.asarray(again.embed_tokens.embedding[...]),
                                np.asarray(ours.embed_tokens.embedding[...]))


def test_a_value_head_is_not_exported(tmp_path):
  model = _hf_model("qwen2_tied_kv1")
  model.save_pretrained(tmp_path / "original")
  critic = huggingface.load_hf_checkpoint(tmp_path / "original", value_head=True)
  huggingface.save_hf_checkpoint(critic, tmp_path / "exported")
  exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
  assert _relative_error(_hf_logits(exported), _hf_logits(model)) <= 1e-5
