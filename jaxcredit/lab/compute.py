"""Model FLOPs a batched run spends per update, charged by its arm (`models.flops`).

One forward pass over a batch passes every token once with its prefix: each row's prompt
(a tree's once), then each response token weighted by its share (1; a tree's shared segment
once: `sampling.tree.token_shares`), its logits taken. Per update an arm is charged:

  - sampling: 1 forward;
  - the learner's gradient step: 3 forwards;
  - a critic arm (it reads V(s_t)): the critic's values (1 forward) and its step (3), both
    without logits (the value head's 2 D a token left out);
  - a PRIME arm: the implicit PRM's step, whose forward scores the batch (3), and the
    reference's log-probs (1);
  - a Monte-Carlo arm: K continuations from each state it evaluates, the one at response
    slot t generating slots t..T-1 with the prefix cached (an upper bound where responses
    stop at EOS).

The exact oracle and the gradient measurements are not training compute and are uncharged.
A run of a cell with a critic or a PRM trains it whatever its arm (`arms`); only the arms
that read it are charged for it.
"""

import math
from typing import TYPE_CHECKING

import jax.numpy as jnp

from jaxcredit import estimators
from jaxcredit.credit import monte_carlo
from jaxcredit.lab import arms
from jaxcredit.models import TransformerConfig, flops
from jaxcredit.tasks import key_token

if TYPE_CHECKING:
  from jaxcredit.lab.cells import Cell

SAMPLING, LEARNER, CRITIC, PRIME = 1, 3, 4, 4  # forwards of each part


def _slot_flops(config: TransformerConfig, prompt_length: int, length: int, logits: bool):
  """[T] float32 forward FLOPs of the token at response slot t (attending to P + t + 1)."""
  keys = prompt_length + 1.0 + jnp.arange(length, dtype=jnp.float32)
  return flops.token_flops(config, keys, logits=logits)


def forward_flops(config: TransformerConfig, prompt_length: int, shares, prompts: int, *,
                  logits: bool = True):
  """Forward FLOPs of one pass over a batch: `prompts` prompts and each response token by its
  share. Traceable.

  prompts * F_seq(P) + sum_{b, t} shares[b, t] F_token(P + t + 1).

  Args:
    config: the model.
    prompt_length: P.
    shares: ``[B, T]`` each response token's share (the response mask as float, or a tree's
      `token_shares`).
    prompts: the prompts passed (B rows; a tree's prompts once).
    logits: take the response tokens' logits.

  Returns:
    a float32 scalar.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.models import flops, preset
    >>> config = preset("tiny", vocab_size=16, n_layers=1, d_model=32, n_heads=2,
    ...                 n_kv_heads=2, d_ff=64)
    >>> full = forward_flops(config, 3, jnp.ones((2, 4)), 2)
    >>> bool(full == 2 * flops.sampling_flops(config, 3, 4))
    True
  """
  prefill = prompts * float(flops.sequence_flops(config, prompt_length, logits=False))
  slot = _slot_flops(config, prompt_length, shares.shape[1], logits)
  return prefill + jnp.sum(shares * slot)


def continuation_flops(config: TransformerConfig, prompt_length: int, continued, k):
  """Forward FLOPs of k continuations from each state continued from: the one at response
  slot t generates slots t..T-1, its prefix cached. Traceable.

  k sum_{b, t: continued} sum_{j >= t} F_token(P + j + 1).

  Args:
    config: the model.
    prompt_length: P.
    continued: ``[B, T]`` bool, the states continued from (the actions at the evaluated
      positions).
    k: continuations per state (may be traced).

  Returns:
    a float32 scalar.
  """
  slot = _slot_flops(config, prompt_length, continued.shape[1], True)
  remaining = jnp.cumsum(slot[::-1])[::-1]  # sum_{j >= t}
  return k * jnp.sum(jnp.where(continued, remaining, 0.0))


def update_flops(config: TransformerConfig, prompt_length: int, shares, prompts: int, *,
                 continued, k, critic, prime):
  """The FLOPs one update charges an arm (module docstring). Traceable.

  Args:
    config: the policy.
    prompt_length: P.
    shares: ``[B, T]`` each response token's share (`forward_flops`).
    prompts: the prompts passed.
    continued: ``[B, T]`` bool, the states the arm's continuations start from.
    k: the arm's Monte-Carlo continuations per state (0: none; may be traced).
    critic: whether the arm reads a critic (may be traced).
    prime: whether the arm reads PRIME's implicit PRM (may be traced).

  Returns:
    a float32 scalar.
  """
  policy = forward_flops(config, prompt_length, shares, prompts)
  trunk = forward_flops(config, prompt_length, shares, prompts, logits=False)
  return ((SAMPLING + LEARNER) * policy + jnp.where(critic, CRITIC * trunk, 0.0)
          + jnp.where(prime, PRIME * policy, 0.0)
          + continuation_flops(config, prompt_length, continued, k))


def fixed_update_flops(cell: "Cell", arm) -> float | None:
  """The FLOPs one update charges `arm` in `cell` (`update_flops`) where they do not depend
  on what is sampled: key_token without a tree (every response has T actions) and an arm
  without Monte-Carlo values or with them at a fixed stride. A run's "charged_flops" after
  u updates is then u times this, so runs that did not record them can be charged.

  Args:
    cell: the batched `Cell`.
    arm: the arm's advantage config (`estimators.from_config`).

  Returns:
    the FLOPs, or None where they depend on the samples (EOS, trees, cutpoints).

  Examples:
    >>> from jaxcredit.lab import cells, compute
    >>> from jaxcredit.models import preset
    >>> from jaxcredit.tasks import key_token
    >>> cell = cells.Cell(task=key_token.KeyTokenConfig(length=6), arms=("grpo",),
    ...                   model=preset("tiny", vocab_size=key_token.VOCAB_SIZE), group_size=4,
    ...                   prompts_per_step=2, updates=10, eval_every=5)
    >>> grpo = compute.fixed_update_flops(cell, "grpo")
    >>> critic = compute.fixed_update_flops(cell, {"name": "gae", "lam": 0.95})
    >>> bool(critic > grpo)
    True
  """
  if not isinstance(cell.task, key_token.KeyTokenConfig) or cell.tree is not None:
    return None
  mc, critic, prime = arms.charges(estimators.from_config(arm))
  if mc.threshold != math.inf:
    return None
  rows = cell.group_size * cell.prompts_per_step
  actions = jnp.ones((rows, cell.task.length), bool)
  continued = monte_carlo.evaluated_positions(actions, None, mc.stride, math.inf)
  return float(update_flops(cell.model, cell.task.prompt_length, actions.astype(jnp.float32),
                            rows, continued=continued, k=mc.k, critic=critic, prime=prime))
