"""Partial responses: those a decode limit cut short (`continuous.generate_partial`), kept
to be resumed by a later call under a newer policy."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit.sampling.sampler import SampleOutput


class Partial(NamedTuple):
  """Responses to resume (`continuous.generate_partial`), in `SampleOutput`'s ``[C, P + N]`` layout.

  Attributes:
    tokens: ``[C, P + N]`` int, the left-padded prompt, then the tokens sampled so far.
    mask: ``[C, P + N]`` bool, the sampled tokens (a prefix of the response columns).
    logprobs: ``[C, P + N]`` float32, each sampled token's log-prob under the policy that drew
      it.
    entropy: ``[C, P + N]`` float32.
    token_valid: ``[C, P + N]`` bool, the prompt's tokens and the sampled ones.
    version: ``[C, P + N]`` int32, the version of the policy that drew each sampled token.
    keys: ``[C]`` the responses' keys.
    budgets: ``[C]`` int32, the responses' budgets.
  """

  tokens: Array
  mask: Array
  logprobs: Array
  entropy: Array
  token_valid: Array
  version: Array
  keys: Array
  budgets: Array


class PartialSample(NamedTuple):
  """What `continuous.generate_partial` returns: the resumed responses, then the new ones.

  Attributes:
    output: the `SampleOutput` of every response (the unfinished ones so far).
    unfinished: ``[R]`` bool, responses the decode limit cut short (resume them with
      `carry_over`).
    version: ``[R, P + N]`` int32, the version of the policy that drew each sampled token.
    keys: ``[R]`` the responses' keys.
    budgets: ``[R]`` int32, their budgets.
  """

  output: SampleOutput
  unfinished: Array
  version: Array
  keys: Array
  budgets: Array


def carry_over(sample: PartialSample, *, pad: bool = False) -> Partial:
  """The unfinished responses of `sample`, to resume in a later `continuous.generate_partial` call.

  Args:
    sample: a `PartialSample`.
    pad: repeat the last unfinished row up to a power of two rows, so that a loop of
      `generate_partial` calls compiles one program per power of two rather than one per
      count. The copies have no budget left: a later call frees their slots as it admits
      them, decoding nothing (drop their rows).

  Returns:
    the `Partial` of its unfinished rows, in order (C = their number, or the power of two
    at or above it with `pad`).
  """
  rows = np.flatnonzero(np.asarray(sample.unfinished))
  copies = np.zeros(rows.size, bool)
  if pad and rows.size:
    padded = np.arange(1 << (rows.size - 1).bit_length())
    rows, copies = rows[np.minimum(padded, rows.size - 1)], padded >= rows.size
  out = sample.output
  return _take_rows(Partial(out.tokens, out.mask, out.logprobs, out.entropy, out.token_valid,
                            sample.version, sample.keys, sample.budgets), jnp.asarray(rows),
                    jnp.asarray(copies))


@jax.jit
def _take_rows(partial: Partial, rows: Array, copies: Array) -> Partial:
  """`partial`'s rows `rows`, every field in one program; `copies` get a budget of the
  tokens they hold (none left)."""
  taken = jax.tree.map(lambda x: x[rows], partial)
  return taken._replace(budgets=jnp.where(copies, jnp.sum(taken.mask, axis=1),
                                          taken.budgets).astype(taken.budgets.dtype))
