"""Per-token log-probabilities and entropies of a policy's logits.

Shapes: logits `[..., V]` with tokens `[...]` (typically `[B, T, V]` and
`[B, T]`); hidden states `[B, T, D]` with an unembedding `[D, V]`. All
reductions run in float32 whatever the input dtype. `dense` computes them from logits;
`chunked` from hidden states and the unembedding, a chunk at a time.
"""

from jaxcredit.logprobs import chunked, dense
from jaxcredit.logprobs.chunked import (ACCUMULATOR_SHARE, chunked_token_logprobs,
                                        chunked_token_logprobs_and_entropy)
from jaxcredit.logprobs.dense import (LOG_RATIO_BOUND, importance_ratio, token_entropy,
                                      token_logprobs, token_sum_probs_squared)

__all__ = ["ACCUMULATOR_SHARE", "LOG_RATIO_BOUND", "chunked", "chunked_token_logprobs",
           "chunked_token_logprobs_and_entropy", "dense", "importance_ratio", "token_entropy",
           "token_logprobs", "token_sum_probs_squared"]
