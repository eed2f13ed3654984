"""What the tasks' exact oracles share: the policy's teacher-forced next-token distributions
restricted to the allowed actions, and an enumerated tree's credit placed on [B, L] rows.

  logp = exact.masked_log_softmax(model, inputs [n, L], allowed_next [L, V])   # [n, L, V]
  credit = exact.tree_credit_rows(tokens, mask, prompt_len, per_prompt=..., ...)
  extras, metrics = exact.as_extras(credit)       # what an oracle's `exact_extras` returns
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit.rollout import Credit
from jaxcredit.sampling import mask_logits


def masked_log_softmax(model, inputs: Array, allowed_next: Array) -> Array:
  """[n, L, V] log pi(. | inputs[:, :i + 1]) at temperature 1, restricted to
  allowed_next[i] (the actions allowed at column i + 1), as the sampler restricts them.
  Traceable."""
  positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
  out = model(inputs, positions=positions, token_valid=jnp.ones(inputs.shape, bool))
  return jax.nn.log_softmax(mask_logits(out.logits.astype(jnp.float32), allowed_next), axis=-1)


def tree_credit_rows(tokens: np.ndarray, mask: np.ndarray, prompt_len: int, *, per_prompt: int,
                     path_length: int, max_passes: int, advice: str, credit_of) -> Credit:
  """The Credit of an enumerated (E-TREE) oracle on [B, L] rows: the tree of each distinct
  prompt costs `per_prompt` teacher-forced paths of `path_length` tokens; more than
  `max_passes` in all is refused (ValueError with the count and `advice`).
  credit_of(prompts [n, P], first [n] a row of each, inverse [B] each row's prompt) returns
  (values, advantages) [B, L - P] of the response columns; they are placed after the
  prompt columns, 0 off `mask`."""
  prompts, first, inverse = np.unique(tokens[:, :prompt_len], axis=0, return_index=True,
                                      return_inverse=True)
  passes = len(prompts) * per_prompt
  if passes > max_passes:
    raise ValueError(f"E-TREE needs {passes:,} teacher-forced paths ({len(prompts)} prompts x "
                     f"{per_prompt:,}), over max_passes = {max_passes:,}: {advice}.")
  values, advantages = (np.asarray(x, np.float64)
                        for x in credit_of(prompts, first, inverse.reshape(-1)))
  rows = lambda x: jnp.asarray(np.where(
      mask, np.concatenate([np.zeros((len(tokens), prompt_len)), x], 1), 0.0), jnp.float32)
  return Credit(advantages=rows(advantages), values=rows(values),
                adv_stderr=jnp.zeros(tokens.shape, jnp.float32), evaluated=jnp.asarray(mask),
                cost={"passes": passes, "tf_tokens": passes * path_length, "rollouts": 0,
                      "gen_tokens": 0, "prefill_tokens": 0})


def as_extras(credit: Credit) -> tuple[dict, dict]:
  """({"oracle_advantages", "oracle_values"} [B, L], {"oracle_passes"}) of an exact oracle's
  credit on a training rollout: what a task oracle's `exact_extras` returns."""
  return ({"oracle_advantages": credit.advantages, "oracle_values": credit.values},
          {"oracle_passes": credit.cost["passes"]})
