"""Prints the token advantages several estimators assign to one sample batch.

python -m jaxcredit.demo
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit import estimators
from jaxcredit.rollout import Rollout

_ESTIMATORS = {
    "grpo": {},
    "dr_grpo": {},
    "rloo": {},
    "reinforce": {"gamma": 1.0},
    "gae": {"gamma": 1.0, "lam": 0.95},
}


def sample_rollout(seed: int = 0) -> Rollout:
  """Two prompts x four responses, ragged lengths, a 2-token prompt, 0/1 rewards."""
  batch, length, prompt = 8, 8, 2
  key_len, key_val, key_tok = jax.random.split(jax.random.key(seed), 3)
  lengths = jax.random.randint(key_len, (batch,), 2, length - prompt + 1)
  positions = jnp.arange(length)[None, :]
  mask = (positions >= prompt) & (positions < prompt + lengths[:, None])
  rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
  return Rollout(
      tokens=jax.random.randint(key_tok, (batch, length), 0, 16),
      mask=mask,
      rewards=rewards,
      values=jnp.where(mask, 0.5 + 0.1 * jax.random.normal(key_val, mask.shape), 0.0),
      group_size=4,
  )


def advantage_table(rollout: Rollout) -> str:
  """One block per estimator: a row per response, a column per token ('.' = masked)."""
  lines = []
  mask = np.asarray(rollout.mask)
  for name, hparams in _ESTIMATORS.items():
    advantages = np.asarray(jax.jit(estimators.get(name))(rollout, **hparams).advantages)
    lines.append(f"{name} {hparams or ''}".rstrip())
    for b in range(mask.shape[0]):
      cells = [f"{a:+6.2f}" if m else "     ." for a, m in zip(advantages[b], mask[b])]
      lines.append(f"  r={float(rollout.rewards[b]):.0f} g{b // rollout.group_size} " +
                   " ".join(cells))
  return "\n".join(lines)


def main() -> None:
  rollout = sample_rollout()
  print(f"jaxcredit demo on {jax.devices()[0].platform}: B=8 responses (2 prompts x 4), T=8")
  print(advantage_table(rollout))


if __name__ == "__main__":
  main()
