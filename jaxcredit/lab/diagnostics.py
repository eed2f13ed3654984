"""What the batched lab measures about credit beyond J(pi), all traceable: how much of a
batch's credit lands off the decisive tokens, the credit the gradient sees where responses
share states, how a critic ranks alternative keys, and how an arm's policy gradient
compares with the exact credit's.

  noisy_tokens(advantages, mask, decisive)        effective noisy tokens per response
  implicit_credit(credit, tokens, seen, G)        the credit the gradient sees
  ranking(critic_scores, exact_values, key)       top-1 agreement with the exact values
  mechanism(sample, gradient, models, advantage, key, ...)   MECHANISM (+ RANKING) metrics

The gradients themselves (a batch's, a group's, the true gradient of J, their noise) are
`lab.gradients`'.
"""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit import estimators
from jaxcredit.lab import arms
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import Actions
from jaxcredit.tasks import key_token

RANKING_KS = (1, 4, 16, 64)  # Monte-Carlo rankings of the alternatives beside the critic's
RANKING = ("critic_top1", "random_top1", *(f"mc{k}_top1" for k in RANKING_KS))
MECHANISM = ("cosine_to_exact", "signal_fraction", "decisive_norm", "filler_norm",
             "credit_cosine", "implicit_credit_cosine")


def noisy_tokens(advantages, mask, decisive):
  """The effective number of noisy tokens of a batch of credit. Traceable.

  Over the responses with any credit, the mean of ``sum_{t not in P} w_t``, where
  ``w_t = |A_t| / max_t' |A_t'|`` is token t's credit weight within its response (broadcast
  credit: T - K; exact credit on filler-blind key_token: 0).

  Args:
    advantages: ``[B, L]`` token credit.
    mask: ``[B, L]`` bool, the actions.
    decisive: ``[L]`` or ``[B, L]`` bool, the decisive tokens P.

  Returns:
    a float32 scalar; 0 when no response has credit.
  """
  weight = jnp.where(mask, jnp.abs(advantages), 0.0)
  top = jnp.max(weight, axis=-1, keepdims=True)
  per_row = jnp.sum(jnp.where(decisive, 0.0, weight / jnp.where(top > 0, top, 1.0)), axis=-1)
  credited = top[:, 0] > 0
  return jnp.sum(jnp.where(credited, per_row, 0.0)) / jnp.maximum(jnp.sum(credited), 1)


def lengths_by_outcome(mask, rewards):
  """The mean length of the rewarded responses and of the others. Traceable.

  Args:
    mask: ``[B, L]`` bool, the actions (a response's length is its action count).
    rewards: ``[B]`` in {0, 1} (> 0.5 counts as rewarded).

  Returns:
    ``(rewarded, others)`` float32 scalars; 0 for an outcome no response has.
  """
  lengths = jnp.sum(mask, axis=1, dtype=jnp.float32)
  right = rewards > 0.5
  mean = lambda where: jnp.sum(jnp.where(where, lengths, 0.0)) / jnp.maximum(jnp.sum(where), 1)
  return mean(right), mean(~right)


def implicit_credit(credit, tokens, seen, group_size: int):
  """Each token's credit averaged over the responses of its group that reach the same state
  and take the same token there. Traceable.

  A state is the prompt, the position and the earlier tokens that later inputs see (`seen`:
  on filler-blind key_token the decisive ones only), so identical (state, token) pairs share
  one policy-gradient term: this is the credit the gradient sees, GRPO's implicit process
  reward where responses share states.

  Args:
    credit: ``[B, L]`` token credit.
    tokens: ``[B, L]`` int, groups of `group_size` consecutive rows, one prompt each.
    seen: ``[L]`` bool, the columns later inputs see.
    group_size: G.

  Returns:
    float32 ``[B, L]``.

  References:
    arXiv 2509.21154 (GRPO's implicit process reward).
  """
  b, length = tokens.shape
  tokens = tokens.reshape(b // group_size, group_size, 1, length)
  credit = credit.reshape(b // group_size, 1, group_size, length)
  pairs = lambda x: x != jnp.swapaxes(x, 1, 2)  # [n, G, G, L]: row i vs row j
  differs = pairs(jnp.where(seen, tokens, 0)).astype(jnp.int32)
  apart_before = jnp.cumsum(differs, axis=-1) - differs > 0  # a decisive choice earlier
  shared = ~pairs(tokens) & ~apart_before
  return (jnp.sum(jnp.where(shared, credit, 0.0), axis=2) / jnp.sum(shared, axis=2)).reshape(
      b, length)


def alternative_values(tree, tokens, config: key_token.KeyTokenConfig, group_size: int):
  """The exact value of each response's state after each alternative key at its k-th decisive
  position (its earlier decisive tokens as sampled), read from the value tree of the batch's
  prompts (E-DEC, filler hidden). Traceable.

  Args:
    tree: the key_token value tree of the batch's prompts, one per group.
    tokens: ``[B, P + T]`` int.
    config: the `KeyTokenConfig`.
    group_size: G.

  Returns:
    float32 ``[B, K, |C|]``.
  """
  n_keys, prompt_len = config.n_keys, config.prompt_length
  index, alternatives = jnp.zeros(tokens.shape[0], jnp.int32), []
  for k, position in enumerate(config.decisive_positions):
    w = jnp.repeat(tree[k + 1], group_size, axis=0)  # [B, |C|^(k+1)]
    alternatives.append(jnp.take_along_axis(w, index[:, None] * n_keys + jnp.arange(n_keys),
                                            axis=1))
    index = index * n_keys + tokens[:, prompt_len + position] - key_token.KEY0
  return jnp.stack(alternatives, axis=1)


def critic_alternatives(critic, batch: Rollout, config: key_token.KeyTokenConfig,
                        actions: Actions):
  """The critic's value of the same states as `alternative_values` (the response with key c at
  its k-th decisive position, read after that token). Traceable.

  Args:
    critic: a `Transformer` with a value head.
    batch: the `Rollout`.
    config: the `KeyTokenConfig`.
    actions: the task's action restrictions.

  Returns:
    float32 ``[B, K, |C|]``.
  """
  n_keys, prompt_len = config.n_keys, config.prompt_length
  b, length = batch.tokens.shape
  columns = prompt_len + np.asarray(config.decisive_positions)
  rows = jnp.broadcast_to(batch.tokens[:, None, None], (b, len(columns), n_keys, length))
  rows = rows.at[:, np.arange(len(columns)), :, columns].set(
      key_token.KEY0 + jnp.arange(n_keys))  # [K, B, |C|]: key c at the k-th column
  repeat = lambda x: jnp.broadcast_to(x[:, None, None], rows.shape).reshape(-1, length)
  values = critic(actions.observe(rows.reshape(-1, length)), positions=repeat(batch.positions),
                  token_valid=repeat(batch.token_valid), logits=False).values
  values = values.reshape(b, len(columns), n_keys, length)
  return jnp.take_along_axis(values, jnp.asarray(columns)[None, :, None, None], axis=-1)[..., 0]


def top1_agreement(scores, exact):
  """The fraction of states whose highest score (the first on ties) falls on an exactly best
  alternative (within 1e-6). Traceable.

  Args:
    scores: ``[..., |C|]`` scores of the alternatives.
    exact: ``[..., |C|]`` their exact values.

  Returns:
    a float32 scalar.
  """
  best = jnp.max(exact, axis=-1, keepdims=True)
  chosen = jnp.take_along_axis(exact, jnp.argmax(scores, axis=-1)[..., None], axis=-1)
  return jnp.mean(chosen >= best - 1e-6)


def ranking(critic_scores, exact, key):
  """Top-1 agreement with the exact values of the alternatives. Traceable.

  Of the critic's scores; of a random order (the share of exact maxima among the
  alternatives); and of Monte-Carlo values from k continuations per alternative
  (Binomial(k, V) / k, ties broken at random) for k in `RANKING_KS`.

  Args:
    critic_scores: ``[B, K, |C|]`` the critic's values.
    exact: ``[B, K, |C|]`` the exact values.
    key: a PRNG key for the Monte-Carlo draws and ties.

  Returns:
    ``{name in RANKING: scalar}``.
  """
  best = jnp.max(exact, axis=-1, keepdims=True)
  out = {"critic_top1": top1_agreement(critic_scores, exact),
         "random_top1": jnp.mean(jnp.mean(exact >= best - 1e-6, axis=-1))}
  draws_key, ties_key = jax.random.split(key)
  ties = jax.random.uniform(ties_key, exact.shape)
  for k in RANKING_KS:  # multiples of 1 / k: ties / (2 k) only breaks ties
    estimate = arms.monte_carlo_values(jax.random.fold_in(draws_key, k), exact, True, k, k)
    out[f"mc{k}_top1"] = top1_agreement(estimate + ties / (2 * k), exact)
  return out


def cosine(x, y, mask):
  """``sum m x y / sqrt(sum m x^2 sum m y^2)``. Traceable.

  Args:
    x: an array.
    y: an array of x's shape.
    mask: bool of x's shape, or True.

  Returns:
    a float32 scalar; 0 when either is 0.
  """
  x, y = jnp.where(mask, x, 0.0), jnp.where(mask, y, 0.0)
  return jnp.sum(x * y) / jnp.maximum(jnp.linalg.norm(x) * jnp.linalg.norm(y), 1e-30)


def mechanism(sample, gradient, models: dict, advantage, key, *, batches: int, decisive, seen,
              group_size: int, rank=None) -> dict:
  """How an arm's credit reaches its gradient, over `batches` fresh batches from the current
  policy.

  The cosine of the arm's policy gradient with the exact-credit gradient on the same batch
  (the oracle's A, RMS-scaled like every arm's), the arm's signal fraction
  ``|mean g|^2 / mean |g|^2`` (1: every batch agrees; 1/R: pure noise over R batches), and
  the norms of its gradient restricted to the decisive and to the other tokens (the gradient
  is linear in the advantages: the two parts sum to it); over tokens, the cosine of the
  arm's credit with the exact credit, raw and as the gradient sees it (`implicit_credit`);
  and with `rank`, how well a critic ranks the alternatives (`ranking`).

  Args:
    sample: ``sample(models, key) -> Rollout``, a batch with the oracle's extras.
    gradient: ``gradient(model, batch, advantages) -> [P]``.
    models: the run's modules.
    advantage: the arm's advantage function.
    key: a PRNG key.
    batches: the number of batches R.
    decisive: ``[L]`` bool, the decisive columns.
    seen: ``[L]`` bool, the columns later inputs see.
    group_size: G.
    rank: ``rank(models, batch, key) -> dict``, or None.

  Returns:
    ``{name in MECHANISM (+ RANKING): scalar}``.
  """
  exact = estimators.from_config({"scale": "rms", "of": "oracle"})
  used = {name: models[name] for name in ("model", "critic", "prm", "reference")
          if name in models}
  models_graphdef, models_state = nnx.split(used)

  def on_batch(models_state, key):
    # Merged in this trace: nnx modules are not shared across trace levels.
    models = nnx.merge(models_graphdef, models_state)
    batch = sample(models, key)
    credit = advantage(batch).advantages
    # The arm's, the exact and the arm's on decisive tokens: one backward pass traced.
    credits = jnp.stack([credit, exact(batch).advantages, jnp.where(decisive, credit, 0.0)])
    _, (g, g_exact, on_decisive) = jax.lax.scan(
        lambda state, c: (state, gradient(nnx.merge(models_graphdef, state)["model"], batch, c)),
        models_state, credits)
    implicit = implicit_credit(credit, batch.tokens, seen, group_size)
    credit_cosines = (cosine(credit, batch.extras["oracle_advantages"], batch.mask),
                      cosine(implicit, batch.extras["oracle_advantages"], batch.mask))
    ranks = {} if rank is None else rank(models, batch, key)
    return (g, cosine(g, g_exact, True), jnp.linalg.norm(on_decisive),
            jnp.linalg.norm(g - on_decisive), *credit_cosines, ranks)

  # One batch at a time: under the vmap over runs, batches side by side would hold every
  # batch's three backward passes at once (0.35 GiB per run at G = 32, 8 x 32 responses).
  keys = jax.random.split(key, batches)
  _, (g, cosines, decisive_norm, filler_norm, credit_cosine, implicit_cosine, ranks) = (
      jax.lax.scan(lambda state, batch_key: (state, on_batch(state, batch_key)),
                   models_state, keys))
  power = jnp.mean(jnp.sum(g**2, axis=1))
  mean_power = jnp.sum(jnp.mean(g, axis=0) ** 2)
  signal = jnp.where(power > 0, mean_power / jnp.where(power > 0, power, 1.0), 0.0)
  return {"cosine_to_exact": jnp.mean(cosines), "signal_fraction": signal,
          "decisive_norm": jnp.mean(decisive_norm), "filler_norm": jnp.mean(filler_norm),
          "credit_cosine": jnp.mean(credit_cosine),
          "implicit_credit_cosine": jnp.mean(implicit_cosine),
          **{name: jnp.mean(value) for name, value in ranks.items()}}


def critic_ranking(task, group_size: int, key_stream: int):
  """The `rank` of `mechanism` on filler-blind key_token: `ranking` of the critic's values of
  the alternative keys against their exact values (E-DEC).

  Args:
    task: key_token's traceable form.
    group_size: G.
    key_stream: the Monte-Carlo rankings draw from ``fold_in(key, key_stream)``.

  Returns:
    ``rank(models, batch, key) -> dict``.
  """
  config, actions = task.config, task.actions

  def rank(models, batch, key):
    prompts = batch.tokens[::group_size, :config.prompt_length]
    symbols = prompts[:, 1:1 + config.n_decisive] - key_token.KEY0
    _, targets = key_token.traceable.prompts_of(symbols, config)
    alternatives = alternative_values(task.value_tree(models["model"], prompts, targets, None),
                                      batch.tokens, config, group_size)
    return ranking(critic_alternatives(models["critic"], batch, config, actions),
                   alternatives, jax.random.fold_in(key, key_stream))

  return rank
