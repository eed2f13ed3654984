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
  """The policy's log-probs after every prefix, at temperature 1, restricted as the sampler
  restricts them. Traceable.

  Args:
    model: the policy.
    inputs: ``[n, L]`` int rows.
    allowed_next: ``[L, V]`` bool, the actions allowed at column i + 1 for row position i.

  Returns:
    float32 ``[n, L, V]``: log pi(. | inputs[:, :i + 1]).
  """
  positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
  out = model(inputs, positions=positions, token_valid=jnp.ones(inputs.shape, bool))
  return jax.nn.log_softmax(mask_logits(out.logits.astype(jnp.float32), allowed_next), axis=-1)


def tree_credit_rows(tokens: np.ndarray, mask: np.ndarray, prompt_len: int, *, per_prompt: int,
                     path_length: int, max_passes: int, advice: str, credit_of) -> Credit:
  """The `Credit` of an enumerated (E-TREE) oracle on ``[B, L]`` rows.

  The tree of each distinct prompt costs `per_prompt` teacher-forced paths of `path_length`
  tokens.

  Args:
    tokens: ``[B, L]`` int rows.
    mask: ``[B, L]`` bool, the actions.
    prompt_len: P.
    per_prompt: teacher-forced paths per distinct prompt.
    path_length: tokens per path.
    max_passes: the most paths allowed in all.
    advice: what to do instead, for the error message.
    credit_of: ``credit_of(prompts [n, P], first [n], inverse [B]) -> (values,
      advantages)`` of the response columns ``[B, L - P]`` (first: a row of each distinct
      prompt; inverse: each row's prompt).

  Returns:
    the `Credit`, values and advantages placed after the prompt columns, 0 off `mask`.

  Raises:
    ValueError: with the count and `advice` when more than `max_passes` paths are needed.
  """
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
  """An exact oracle's credit on a training rollout as rollout extras: what a task oracle's
  `exact_extras` returns.

  Args:
    credit: the oracle's `Credit`.

  Returns:
    ``({"oracle_advantages", "oracle_values"}, {"oracle_passes"})``.
  """
  return ({"oracle_advantages": credit.advantages, "oracle_values": credit.values},
          {"oracle_passes": credit.cost["passes"]})
