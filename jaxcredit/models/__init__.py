"""Policy and critic models: a Flax NNX Llama/Qwen2-style transformer."""

from jaxcredit.models.checkpoint import config_from_hf, load_hf_checkpoint
from jaxcredit.models import sharding
from jaxcredit.models.config import PRESETS, TransformerConfig, preset
from jaxcredit.models.transformer import KVCache, ModelOutput, RMSNorm, Transformer, rope

__all__ = [
    "KVCache",
    "ModelOutput",
    "PRESETS",
    "RMSNorm",
    "Transformer",
    "TransformerConfig",
    "config_from_hf",
    "load_hf_checkpoint",
    "preset",
    "rope",
    "sharding",
]
