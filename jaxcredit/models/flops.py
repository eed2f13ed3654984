"""Model FLOPs of the transformer's passes, to charge compute as well as tokens.

Two FLOPs per multiply-add of every matrix product (the model-FLOPs convention of Kaplan et
al. and PaLM): per token and layer the q/k/v/o projections, SwiGLU's three products and
attention's two (scores and the weighted sum) over the keys the token attends to; per token
the unembedding where logits are taken (and the value head). Norms, RoPE and softmax are
left out (a few percent of a block at d_model >= 128). A backward pass costs twice its
forward, so a gradient step costs 3x its forward.

References:
  Kaplan et al., 2020, "Scaling Laws for Neural Language Models", arXiv 2001.08361 (2.1).
  Chowdhery et al., 2022, "PaLM", arXiv 2204.02311 (appendix B).
"""

from jaxcredit.models.config import TransformerConfig


def _per_token(config: TransformerConfig) -> int:
  """A token's FLOPs through every layer but attention's score and weighted-sum products."""
  hd, d = config.resolved_head_dim, config.d_model
  projections = d * (config.n_heads + 2 * config.n_kv_heads) * hd + config.n_heads * hd * d
  return config.n_layers * 2 * (projections + 3 * d * config.d_ff)


def _attention(config: TransformerConfig, keys) -> int:
  """Score and weighted-sum FLOPs of `keys` (query, key) pairs through every layer."""
  return config.n_layers * 4 * config.n_heads * config.resolved_head_dim * keys


def _heads(config: TransformerConfig) -> int:
  """A token's unembedding (and value head) FLOPs."""
  return 2 * config.d_model * (config.vocab_size + (1 if config.value_head else 0))


def token_flops(config: TransformerConfig, keys, *, logits: bool = True):
  """Forward FLOPs of one token that attends to `keys` tokens (itself included).

  2 n_layers (D (H + 2 H_kv) hd + H hd D + 3 D F) + 4 n_layers H hd keys, + 2 D V for its
  logits (+ 2 D with a value head).

  Args:
    config: the model.
    keys: the keys it attends to (an int, or a float array of them, traceable: model FLOPs
      overflow int32).
    logits: count its unembedding (and value head).

  Returns:
    FLOPs (of the type of `keys`).

  Examples:
    >>> from jaxcredit.models import preset
    >>> config = preset("tiny", vocab_size=16, n_layers=1, d_model=32, n_heads=2,
    ...                 n_kv_heads=2, d_ff=64)
    >>> token_flops(config, 1, logits=False)  # 2 (4 D H hd + 3 D F) + 4 H hd
    20608
  """
  return _per_token(config) + (_heads(config) if logits else 0) + _attention(config, keys)


def sequence_flops(config: TransformerConfig, length: int, *, causal: bool = True,
                   logits: bool = True) -> int:
  """Forward FLOPs of a teacher-forced pass over one row of `length` tokens.

  L (F_token + F_head) + F_attention(keys), where keys = L (L + 1) / 2 causally (token i
  attends to tokens 0..i: what the pass needs) or L^2 (what a pass computing the whole score
  matrix does: `attention="xla"`).

  Args:
    config: the model.
    length: L, the row's tokens (prompt and response).
    causal: count each token's own prefix of keys; False counts all L.
    logits: count the unembedding (and value head) of every token.

  Returns:
    FLOPs.

  Examples:
    >>> from jaxcredit.models import preset
    >>> config = preset("tiny", vocab_size=16, n_layers=1, d_model=32, n_heads=2,
    ...                 n_kv_heads=2, d_ff=64)
    >>> sequence_flops(config, 3) == sum(token_flops(config, k) for k in (1, 2, 3))
    True
  """
  keys = length * (length + 1) // 2 if causal else length * length
  return length * (_per_token(config) + (_heads(config) if logits else 0)) + _attention(
      config, keys)


def sampling_flops(config: TransformerConfig, prompt_length: int, new_tokens: int) -> int:
  """Forward FLOPs of sampling `new_tokens` after a prompt: a KV-cache sampler passes each of
  the P + T tokens through the model once, each attending to its prefix (one causal pass
  over the row), and takes the logits of the T positions that draw a token.

  Args:
    config: the model.
    prompt_length: P.
    new_tokens: T, the tokens drawn.

  Returns:
    FLOPs of one row.

  Examples:
    >>> from jaxcredit.models import preset
    >>> config = preset("tiny", vocab_size=16, n_layers=1, d_model=32, n_heads=2,
    ...                 n_kv_heads=2, d_ff=64)
    >>> sampling_flops(config, 4, 2) == sequence_flops(config, 6, logits=False) + 2 * 2 * 32 * 16
    True
  """
  return sequence_flops(config, prompt_length + new_tokens, logits=False) + new_tokens * _heads(
      config)
