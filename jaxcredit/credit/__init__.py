"""Credit machinery the trainer and the lab share: Monte-Carlo values and credit from a
policy's own continuations (VinePPO, and its Rao-Blackwellised form), the implicit process
reward model (PRIME), token statistics (KTAE), and the extras registry that provides each
estimator what it needs (`extras`; the built-in providers in `providers`).

  credit = monte_carlo.mc_credit(model, task, tokens, mask, token_valid, examples, key, k=4)
  hook = extras.hook(advantage, temperature=1.0, task=task)   # extras a rollout needs
"""

from jaxcredit.credit import (extras, implicit_prm, monte_carlo, providers, rao_blackwell,
                              token_statistics)
from jaxcredit.rollout import Credit

__all__ = ["Credit", "extras", "implicit_prm", "monte_carlo", "providers", "rao_blackwell",
           "token_statistics"]
