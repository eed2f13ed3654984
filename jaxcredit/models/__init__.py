"""Policy and critic models: a Flax NNX Llama 3 / Qwen2 / Qwen3-style transformer."""

from jaxcredit.models.huggingface import (config_from_hf, hf_config, load_hf_checkpoint,
                                         read_config, save_hf_checkpoint, stop_tokens)
from jaxcredit.models import sharding
from jaxcredit.models.config import PRESETS, RopeScaling, TransformerConfig, preset
from jaxcredit.models.layers import RMSNorm, rope, rope_frequencies
from jaxcredit.models.transformer import KVCache, ModelOutput, Transformer

__all__ = [
    "KVCache",
    "ModelOutput",
    "PRESETS",
    "RMSNorm",
    "RopeScaling",
    "Transformer",
    "TransformerConfig",
    "config_from_hf",
    "hf_config",
    "load_hf_checkpoint",
    "preset",
    "read_config",
    "rope",
    "rope_frequencies",
    "save_hf_checkpoint",
    "sharding",
    "stop_tokens",
]
