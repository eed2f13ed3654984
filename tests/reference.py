"""Independent float64 NumPy references, written as plain loops from the formulas."""

import numpy as np


def discounted_returns(rewards, mask, gamma):
  rewards, mask = np.asarray(rewards, np.float64), np.asarray(mask, bool)
  out = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    running = 0.0
    for t in reversed(range(rewards.shape[1])):
      if mask[b, t]:
        running = rewards[b, t] + gamma * running
        out[b, t] = running
  return out


def gae(rewards, values, mask, gamma, lam):
  rewards, values = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
  mask = np.asarray(mask, bool)
  adv = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    valid = np.flatnonzero(mask[b])
    next_value, next_adv = 0.0, 0.0
    for t in valid[::-1]:
      delta = rewards[b, t] + gamma * next_value - values[b, t]
      adv[b, t] = delta + gamma * lam * next_adv
      next_value, next_adv = values[b, t], adv[b, t]
  returns = np.where(mask, adv + np.where(mask, values, 0.0), 0.0)
  return adv, returns


def grpo(rewards, group_size, eps=1e-6, scale_by_std=True):
  rewards = np.asarray(rewards, np.float64)
  out = np.zeros_like(rewards)
  if group_size == 1:
    return out
  for start in range(0, len(rewards), group_size):
    group = rewards[start : start + group_size]
    centred = group - group.mean()
    out[start : start + group_size] = (
        centred / (group.std(ddof=1) + eps) if scale_by_std else centred
    )
  return out


def rloo(rewards, group_size):
  rewards = np.asarray(rewards, np.float64)
  out = np.zeros_like(rewards)
  if group_size == 1:
    return out
  for i in range(len(rewards)):
    start = i - i % group_size
    others = [rewards[j] for j in range(start, start + group_size) if j != i]
    out[i] = rewards[i] - np.mean(others)
  return out


def log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def token_logprobs(logits, tokens, temperature=1.0):
  logp = log_softmax(np.asarray(logits, np.float64) / temperature)
  return np.take_along_axis(logp, np.asarray(tokens)[..., None], -1)[..., 0]


def token_entropy(logits):
  logp = log_softmax(logits)
  p = np.exp(logp)
  return -np.sum(np.where(p > 0, p * logp, 0.0), -1)


def aggregate(loss_tok, mask, mode, norm_len=None):
  loss_tok, mask = np.asarray(loss_tok, np.float64), np.asarray(mask, bool)
  loss = np.where(mask, loss_tok, 0.0)
  n_rows, n_cols = loss.shape
  if mode == "token-mean":
    return loss.sum() / mask.sum() if mask.sum() else 0.0
  if mode == "seq-mean-token-sum":
    return np.mean([loss[b].sum() for b in range(n_rows)])
  if mode == "seq-mean-token-mean":
    return np.mean([loss[b].sum() / mask[b].sum() if mask[b].any() else 0.0 for b in range(n_rows)])
  return loss.sum() / (n_rows * (norm_len or n_cols))


def ppo_clip_tokens(logp, old_logp, adv, clip_low, clip_high, dual_clip=None):
  logp, old_logp, adv = (np.asarray(x, np.float64) for x in (logp, old_logp, adv))
  out = np.zeros_like(logp)
  for idx in np.ndindex(logp.shape):
    ratio = np.exp(logp[idx] - old_logp[idx])
    a = adv[idx]
    loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
    if dual_clip is not None and a < 0:
      loss = min(loss, -a * dual_clip)
    out[idx] = loss
  return out


def gspo(logp, old_logp, seq_adv, mask, clip_low, clip_high):
  total = 0.0
  for b in range(logp.shape[0]):
    valid = np.asarray(mask[b], bool)
    if not valid.any():
      continue
    log_ratio = np.asarray(logp[b], np.float64)[valid] - np.asarray(old_logp[b], np.float64)[valid]
    s = np.exp(log_ratio.mean())
    a = float(seq_adv[b])
    total += max(-a * s, -a * min(max(s, 1 - clip_low), 1 + clip_high))
  return total / logp.shape[0]


def kl(logp, ref_logp, kind):
  d = np.asarray(logp, np.float64) - np.asarray(ref_logp, np.float64)
  return {"k1": d, "k2": d**2 / 2, "k3": np.exp(-d) + d - 1}[kind]


def dpo(pc, pr, rc, rr, beta):
  logits = beta * ((np.asarray(pc, np.float64) - rc) - (np.asarray(pr, np.float64) - rr))
  return np.mean(np.log1p(np.exp(-logits)))


def _valid_rows(mask):
  return [np.flatnonzero(row) for row in np.asarray(mask, bool)]


def lambda_returns(rewards, values, mask, gamma, lam):
  out = np.zeros(np.shape(rewards))
  for b, valid in enumerate(_valid_rows(mask)):
    next_value, next_return = 0.0, 0.0
    for t in valid[::-1]:
      out[b, t] = rewards[b, t] + gamma * ((1 - lam) * next_value + lam * next_return)
      next_value, next_return = float(values[b, t]), out[b, t]
  return out


def n_step_returns(rewards, values, mask, n, gamma):
  out = np.zeros(np.shape(rewards))
  for b, valid in enumerate(_valid_rows(mask)):
    for i, t in enumerate(valid):
      steps = valid[i : i + n]
      total = sum(gamma**k * float(rewards[b, s]) for k, s in enumerate(steps))
      if i + n < len(valid):
        total += gamma**n * float(values[b, valid[i + n]])
      out[b, t] = total
  return out


def vtrace(rewards, values, mask, log_rhos, gamma, lam, clip_rho, clip_c):
  vs = np.zeros(np.shape(rewards))
  pg = np.zeros(np.shape(rewards))
  for b, valid in enumerate(_valid_rows(mask)):
    next_vs, next_value = 0.0, 0.0
    for t in valid[::-1]:
      ratio = np.exp(float(log_rhos[b, t]))
      rho, c = min(clip_rho, ratio), lam * min(clip_c, ratio)
      value, reward = float(values[b, t]), float(rewards[b, t])
      vs[b, t] = (value + rho * (reward + gamma * next_value - value)
                  + gamma * c * (next_vs - next_value))
      pg[b, t] = rho * (reward + gamma * (lam * next_vs + (1 - lam) * next_value) - value)
      next_vs, next_value = vs[b, t], value
  return vs, pg


def grpo_batch_std(rewards, group_size, eps=1e-6):
  rewards = np.asarray(rewards, np.float64)
  if len(rewards) == 1:
    return np.zeros(1)
  means = np.repeat(rewards.reshape(-1, group_size).mean(1), group_size)
  return (rewards - means) / (rewards.std(ddof=1) + eps)


def opo(rewards, lengths, group_size):
  out = np.zeros(len(rewards))
  if group_size == 1:
    return out
  for start in range(0, len(rewards), group_size):
    r = np.asarray(rewards[start : start + group_size], np.float64)
    l = np.asarray(lengths[start : start + group_size], np.float64)
    baseline = (l * r).sum() / l.sum() if l.sum() else 0.0
    out[start : start + group_size] = r - baseline
  return out


def pass_at_k(rewards, group_size, k):
  from math import comb

  out = np.zeros(len(rewards))
  for start in range(0, len(rewards), group_size):
    correct = np.asarray(rewards[start : start + group_size]) > 0
    n, n_wrong = group_size, int((~correct).sum())
    pass_k = 1 - comb(n_wrong, k) / comb(n, k)
    std = np.sqrt(pass_k * (1 - pass_k))
    if std == 0:
      continue
    miss = comb(n_wrong - 1, k - 1) / comb(n - 1, k - 1) if n_wrong >= 1 else 0.0
    for i, ok in enumerate(correct):
      out[start + i] = (1 - pass_k) / std if ok else (1 - pass_k - miss) / std
  return out


def gpg(rewards, group_size, scale_by_std, eps=1e-6):
  rewards = np.asarray(rewards, np.float64)
  groups = rewards.reshape(-1, group_size)
  degenerate_rows = sum(group_size for g in groups if np.all(g == g[0]))
  alpha = len(rewards) / max(len(rewards) - degenerate_rows, 1)
  out = []
  for g in groups:
    centred = g - g.mean()
    if scale_by_std and group_size > 1:
      centred = centred / (g.std(ddof=1) + eps)
    out.extend(alpha * centred)
  return np.array(out)


def whiten(x, mask, shift_mean=True, eps=1e-8):
  x, mask = np.asarray(x, np.float64), np.asarray(mask, bool)
  values = x[mask]
  mean = values.mean() if values.size else 0.0
  var = values.var(ddof=1) if values.size > 1 else 0.0
  out = (x - mean) / np.sqrt(var + eps) + (0.0 if shift_mean else mean)
  return np.where(mask, out, 0.0)


def prm_token_rewards(scores, ends, step_mask, mask, form, temperature):
  out = np.zeros(np.shape(mask))
  for b in range(len(scores)):
    valid = np.asarray(step_mask[b], bool)
    s = np.asarray(scores[b], np.float64)
    if form == "min" and valid.any():
      logits = -s[valid] / temperature
      w = np.exp(logits - logits.max())
      s = s.copy()
      s[valid] = s[valid] * w / w.sum()
    for j in np.flatnonzero(valid):
      end = int(ends[b, j])
      if 0 <= end < out.shape[1] and mask[b, end]:
        out[b, end] += s[j]
  return out


def optimal_token_baseline(returns, logprobs, sum_pi_sq, mask, group_size, eps=1e-8):
  mask = np.asarray(mask, bool)
  batch, length = mask.shape
  weights = np.zeros((batch, length))
  for b in range(batch):
    running = 0.0
    for t in range(length):
      if mask[b, t]:
        running += 1 - 2 * np.exp(float(logprobs[b, t])) + float(sum_pi_sq[b, t])
        weights[b, t] = running
  out = np.zeros((batch, length))
  for start in range(0, batch, group_size):
    rows = range(start, start + group_size)
    for t in range(length):
      num = sum(float(returns[i, t]) * weights[i, t] for i in rows if mask[i, t])
      den = sum(weights[i, t] for i in rows if mask[i, t]) + eps
      for i in rows:
        if mask[i, t]:
          out[i, t] = float(returns[i, t]) - num / den
  return out


def _log_ratio(logp, old_logp):
  return np.asarray(logp, np.float64) - np.asarray(old_logp, np.float64)


def cispo_tokens(logp, old_logp, adv, clip_low, clip_high):
  weight = np.clip(np.exp(_log_ratio(logp, old_logp)), 1 - clip_low, 1 + clip_high)
  return -weight * np.asarray(adv, np.float64) * np.asarray(logp, np.float64)


def sapo_tokens(logp, old_logp, adv, tau_pos, tau_neg):
  ratio = np.exp(_log_ratio(logp, old_logp))
  adv = np.asarray(adv, np.float64)
  tau = np.where(adv > 0, tau_pos, tau_neg)
  return -(4 / tau) / (1 + np.exp(-tau * (ratio - 1))) * adv


def gmpo(logp, old_logp, adv, mask, clip_low, clip_high):
  total = 0.0
  for b in range(len(logp)):
    valid = np.asarray(mask[b], bool)
    if not valid.any():
      continue
    a = np.asarray(adv[b], np.float64)[valid].mean()
    lr = _log_ratio(logp[b], old_logp[b])[valid]
    if a > 0:
      lr = np.minimum(lr, clip_high)
    elif a < 0:
      lr = np.maximum(lr, -clip_low)
    total += -a * np.exp(lr.mean())
  return total / len(logp)


def gspo_token_tokens(logp, old_logp, adv, mask, clip_low, clip_high):
  out = np.zeros(np.shape(logp))
  for b in range(len(logp)):
    valid = np.asarray(mask[b], bool)
    if not valid.any():
      continue
    s = np.exp(_log_ratio(logp[b], old_logp[b])[valid].mean())
    a = np.asarray(adv[b], np.float64)
    out[b] = np.maximum(-a * s, -a * np.clip(s, 1 - clip_low, 1 + clip_high))
  return out


def covariance(logp, adv, mask):
  mask = np.asarray(mask, bool)
  logp, adv = np.asarray(logp, np.float64), np.asarray(adv, np.float64)
  return np.where(mask, (adv - adv[mask].mean()) * (logp - logp[mask].mean()), 0.0)


def top_n(scores, eligible, n):
  flat = np.where(eligible, scores, -np.inf).reshape(-1)
  chosen = np.zeros(flat.size, bool)
  chosen[np.argsort(-flat, kind="stable")[:n]] = True
  return chosen.reshape(np.shape(scores)) & eligible


def value_tokens(values, old_values, returns, clip):
  values, old_values, returns = (np.asarray(x, np.float64) for x in (values, old_values, returns))
  error = (values - returns) ** 2
  if clip is None:
    return 0.5 * error
  clipped = old_values + np.clip(values - old_values, -clip, clip)
  return 0.5 * np.maximum(error, (clipped - returns) ** 2)


def ipo(pc, pr, rc, rr, beta):
  h = (np.asarray(pc, np.float64) - rc) - (np.asarray(pr, np.float64) - rr)
  return np.mean((h - 1 / (2 * beta)) ** 2)


def simpo(pc, pr, lc, lr, beta, gamma):
  logits = beta * np.asarray(pc, np.float64) / lc - beta * np.asarray(pr, np.float64) / lr - gamma
  return np.mean(np.log1p(np.exp(-logits)))


def segment_advantages(values, evaluated, rewards, mask):
  """VinePPO segment credit, one row and one token at a time (float64)."""
  values, rewards = np.asarray(values, np.float64), np.asarray(rewards, np.float64)
  out = np.zeros(values.shape)
  for b in range(values.shape[0]):
    points = [t for t in range(values.shape[1]) if mask[b, t] and evaluated[b, t]]
    for t in range(values.shape[1]):
      if not mask[b, t]:
        continue
      before = [p for p in points if p <= t]
      after = [p for p in points if p > t]
      start = values[b, before[-1]] if before else 0.0
      end = values[b, after[0]] if after else rewards[b]
      out[b, t] = end - start
  return out


# Off-policy losses: logp (pi_theta), old (pi_old, proximal), beh (mu), [B, T] float64 loops.


def is_log_weight(old, beh, mask, level):
  """Per-token log w at level token / sequence (row sum) / geometric (row mean)."""
  old, beh, mask = np.asarray(old, np.float64), np.asarray(beh, np.float64), np.asarray(mask, bool)
  out = np.zeros(old.shape)
  for b in range(old.shape[0]):
    row = (old[b] - beh[b])[mask[b]]
    for t in range(old.shape[1]):
      if mask[b, t]:
        value = {
          "token": old[b, t] - beh[b, t],
          "sequence": row.sum(),
          "geometric": row.mean() if row.size else 0.0,
        }[level]
        out[b, t] = min(max(value, -20.0), 20.0)
  return out


def tis(logp, old, beh, adv, mask, cap, level, clip_low, clip_high, mode):
  weight = np.minimum(np.exp(is_log_weight(old, beh, mask, level)), cap)
  return aggregate(weight * ppo_clip_tokens(logp, old, adv, clip_low, clip_high), mask, mode)


def masked_is(logp, old, beh, adv, mask, low, high, level, clip_low, clip_high, mode):
  w = np.exp(is_log_weight(old, beh, mask, "geometric" if level == "sequence" else "token"))
  weight = np.where((w >= low) & (w <= high), w, 0.0)
  return aggregate(weight * ppo_clip_tokens(logp, old, adv, clip_low, clip_high), mask, mode)


def loglinear_proximal(logp, beh, staleness, mask):
  out = np.zeros(np.shape(logp))
  for b, s in enumerate(staleness):
    alpha = (s - 1) / s if s > 1 else 0.0
    for t in range(out.shape[1]):
      if mask[b][t]:
        out[b, t] = beh[b][t] + alpha * (logp[b][t] - beh[b][t])
  return out


def decoupled_ppo(
  logp, old, beh, adv, mask, cap, cap_mode, level, clip_low, clip_high, dual_clip, mode
):
  w = np.exp(is_log_weight(old, beh, mask, "geometric" if level == "sequence" else "token"))
  if cap is not None:
    w = np.where(w > cap, 0.0, w) if cap_mode == "mask" else np.minimum(w, cap)
  tokens = ppo_clip_tokens(logp, old, adv, clip_low, clip_high, dual_clip)
  return aggregate(w * tokens, mask, mode)


def opsm(logp, old, beh, adv, mask, delta, clip_low, clip_high, mode):
  mask = np.asarray(mask, bool)
  keep = np.ones(mask.shape)
  for b in range(mask.shape[0]):
    if mask[b].any():
      kl = (np.asarray(beh[b], np.float64) - np.asarray(logp[b], np.float64))[mask[b]].mean()
      keep[b] = np.where((np.asarray(adv[b]) < 0) & (kl > delta), 0.0, 1.0)
  return aggregate(keep * ppo_clip_tokens(logp, old, adv, clip_low, clip_high), mask, mode)


def dppo(logp, old, adv, mask, divergence, clip_low, clip_high, ratio_cap, mode):
  out = np.zeros(np.shape(logp))
  for idx in np.ndindex(out.shape):
    lp, lq, a = float(logp[idx]), float(old[idx]), float(adv[idx])
    p, q = np.exp(lp), np.exp(lq)
    if divergence == "tv":
      keep = p - q <= clip_high if a > 0 else p - q >= -clip_low
    else:
      kl = q * (lq - lp) + (1 - q) * np.log((1 - q + 1e-8) / (1 - p + 1e-8))
      keep = (kl <= clip_high or p <= q) if a > 0 else (kl <= clip_low or p >= q)
    out[idx] = -a * min(np.exp(lp - lq), ratio_cap) * lp if keep else 0.0
  return aggregate(out, mask, mode)


def m2_keep(log_w, mask, threshold):
  """Drop the largest (log w)^2, largest first (row-major ties), until the rest's mean is below
  threshold."""
  mask = np.asarray(mask, bool)
  m2 = np.square(np.asarray(log_w, np.float64))
  flat = [(m2[idx], n) for n, idx in enumerate(np.ndindex(m2.shape)) if mask[idx]]
  ordered = sorted(flat, key=lambda item: (-item[0], item[1]))
  dropped = max(len(ordered) - 1, 0)
  for k in range(len(ordered)):
    if np.mean([v for v, _ in ordered[k:]]) < threshold:
      dropped = k
      break
  drop = {n for _, n in ordered[:dropped]}
  keep = np.zeros(m2.shape, bool)
  for n, idx in enumerate(np.ndindex(m2.shape)):
    keep[idx] = mask[idx] and n not in drop
  return keep


def m2po(logp, old, beh, adv, mask, threshold, mode):
  keep = m2_keep(np.where(mask, np.asarray(old, np.float64) - beh, 0.0), mask, threshold)
  return aggregate(-np.asarray(adv, np.float64) * np.exp(_log_ratio(logp, old)) * keep, mask, mode)


def sat(logp, old, adv, mask, staleness, clip_low, clip_high, decay, mode):
  out = np.zeros(np.shape(logp))
  for b, s in enumerate(staleness):
    scale = 1.0 / (1.0 + decay * max(s, 0))
    out[b] = ppo_clip_tokens(
      logp[b : b + 1], old[b : b + 1], adv[b : b + 1], clip_low * scale, clip_high * scale
    )[0]
  return aggregate(out, mask, mode)


def topr(logp, beh, adv, mask, level, threshold, mode):
  log_r = is_log_weight(logp, beh, mask, level)
  adv = np.asarray(adv, np.float64)
  alpha = np.where(adv <= threshold, np.minimum(np.exp(log_r), 1.0), 1.0)
  return aggregate(-alpha * adv * np.asarray(logp, np.float64), mask, mode)


def _turns(turn_ids, mask):
  """{turn id: [action positions]} of one row, in order."""
  turns = {}
  for t in np.flatnonzero(mask):
    turns.setdefault(int(turn_ids[t]), []).append(t)
  return turns


def _normalised(values, eps, scale_by_std):
  values = np.asarray(values, np.float64)
  if len(values) < 2:
    return np.zeros_like(values)
  centred = values - values.mean()
  if not scale_by_std:
    return centred
  std = values.std(ddof=1)
  return np.zeros_like(values) if std == 0 else centred / (std + eps)


def turn_gae(turn_rewards, values, turn_ids, mask, gamma, lam):
  mask = np.asarray(mask, bool)
  adv, ret = np.zeros(mask.shape), np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    turns = list(_turns(turn_ids[b], mask[b]).values())
    next_value, next_adv = 0.0, 0.0
    for positions in reversed(turns):
      r = float(np.sum(np.asarray(turn_rewards[b], np.float64)[positions]))
      v = float(values[b][positions[0]])
      a = r + gamma * next_value - v + gamma * lam * next_adv
      adv[b, positions], ret[b, positions] = a, a + v
      next_value, next_adv = v, a
  return adv, ret


def mt_grpo(
  turn_rewards, rewards, turn_ids, mask, group_size, outcome_coef, eps=1e-6, scale_by_std=True
):
  mask = np.asarray(mask, bool)
  outcome = grpo(rewards, group_size, eps, scale_by_std)
  out = np.zeros(mask.shape)
  for start in range(0, mask.shape[0], group_size):
    rows = range(start, start + group_size)
    turns = {b: _turns(turn_ids[b], mask[b]) for b in rows}
    for k in sorted({k for b in rows for k in turns[b]}):
      having = [b for b in rows if k in turns[b]]
      sums = [np.sum(np.asarray(turn_rewards[b], np.float64)[turns[b][k]]) for b in having]
      for b, a in zip(having, _normalised(sums, eps, scale_by_std)):
        out[b, turns[b][k]] = a + outcome_coef * outcome[b]
  return out


def gigpo(
  turn_rewards,
  rewards,
  anchors,
  turn_ids,
  mask,
  group_size,
  step_coef,
  gamma,
  eps=1e-6,
  scale_by_std=True,
):
  mask = np.asarray(mask, bool)
  episode = grpo(rewards, group_size, eps, scale_by_std)
  out = np.zeros(mask.shape)
  for start in range(0, mask.shape[0], group_size):
    steps = []  # (row, positions, anchor, discounted return from the turn)
    for b in range(start, start + group_size):
      turns = list(_turns(turn_ids[b], mask[b]).values())
      rs = [np.sum(np.asarray(turn_rewards[b], np.float64)[p]) for p in turns]
      for k, positions in enumerate(turns):
        ret = sum(gamma ** (j - k) * rs[j] for j in range(k, len(turns)))
        steps.append((b, positions, int(anchors[b][positions[0]]), ret))
    for anchor in {s[2] for s in steps}:
      same = [s for s in steps if s[2] == anchor]
      for (b, positions, _, _), a in zip(
        same, _normalised([s[3] for s in same], eps, scale_by_std)
      ):
        out[b, positions] = episode[b] + step_coef * a
  return out


def maxrl(rewards, group_size):
  """(r - mean_g) / mean_g, 0 where mean_g <= 0."""
  rewards = np.asarray(rewards, np.float64)
  out = np.zeros_like(rewards)
  for start in range(0, len(rewards), group_size):
    group = rewards[start : start + group_size]
    mean = group.mean()
    if mean > 0:
      out[start : start + group_size] = (group - mean) / mean
  return out


def gdpo(components, group_size, weights=None, eps=1e-6):
  """Each component GRPO-normalised in its group, weighted, summed, then whitened over the
  batch (ddof = 1)."""
  components = np.asarray(components, np.float64)
  weights = np.ones(components.shape[1]) if weights is None else np.asarray(weights, np.float64)
  total = sum(w * grpo(components[:, k], group_size, eps=eps) for k, w in enumerate(weights))
  if len(total) == 1:
    return np.zeros(1)
  std = total.std(ddof=1)
  return (total - total.mean()) / (std + eps) if std > 0 else np.zeros_like(total)


def _tree(rewards, path, group_size):
  """{node id: rewards of the leaves below it} and each row's group rewards."""
  rewards, path = np.asarray(rewards, np.float64), np.asarray(path)
  leaves = {}
  for b, row in enumerate(path):
    for node in row[row >= 0]:
      leaves.setdefault(int(node), []).append(rewards[b])
  groups = [rewards[b - b % group_size: b - b % group_size + group_size]
            for b in range(len(rewards))]
  return {n: np.asarray(v) for n, v in leaves.items()}, groups


def _z(r, subgroup, eps):
  """(r - mean) / (std (ddof 1) + eps), 0 for a subgroup of equal rewards or one leaf."""
  std = subgroup.std(ddof=1) if len(subgroup) > 1 else 0.0
  return 0.0 if std == 0 else (r - subgroup.mean()) / (std + eps)


def tree_credit(name, rewards, path, segments, mask, group_size, eps=1e-6):
  """The tree estimators (spo_tree, treerl, tempo, treepo, tree_grpo) by walking each row's
  path: [B, T] float64 (treepo whitened with eps 1e-8, its default)."""
  leaves, groups = _tree(rewards, path, group_size)
  rewards, path = np.asarray(rewards, np.float64), np.asarray(path)
  segments, mask = np.asarray(segments), np.asarray(mask, bool)
  out = np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    nodes = [int(n) for n in path[b] if n >= 0]
    value = lambda k: groups[b].mean() if k < 0 else leaves[nodes[k]].mean()
    for t in np.flatnonzero(mask[b]):
      k = int(segments[b, t])
      if k < 0:
        continue
      if name == "spo_tree":
        out[b, t] = value(k) - value(k - 1)
      elif name == "treerl":
        out[b, t] = (2 * value(k) - value(-1) - value(k - 1)) / np.sqrt(len(leaves[nodes[k]]))
      elif name == "tempo":
        first = t == 0 or segments[b, t - 1] != k
        out[b, t] = _z(rewards[b], groups[b], eps) + (value(k) - value(k - 1) if first else 0.0)
      elif name == "treepo":  # before whitening
        subgroups = [groups[b]] + [leaves[n] for n in nodes if len(leaves[n]) >= 2]
        out[b, t] = (sum(len(s) * (rewards[b] - s.mean()) for s in subgroups)
                     / sum(len(s) for s in subgroups))
      elif name == "tree_grpo":
        out[b, t] = _z(rewards[b], leaves[nodes[0]], eps) + _z(rewards[b], groups[b], eps)
  if name == "treepo":  # whitened over the valid tokens (mean, unbiased variance)
    values = out[mask]
    var = values.var(ddof=1) if values.size > 1 else 0.0
    out = np.where(mask, (out - (values.mean() if values.size else 0.0)) / np.sqrt(var + 1e-8),
                   0.0)
  return out



def lambda_grpo_weights(lengths, group_size, lam, r=1.0, h_min=1e-3, eps=1e-6):
  lengths = np.asarray(lengths, np.float64)
  out = np.ones_like(lengths)
  if group_size == 1:
    return out
  for start in range(0, len(lengths), group_size):
    group = lengths[start : start + group_size]
    std = group.std(ddof=1)
    z = (group - group.mean()) / (std + eps) if std > 0 else np.zeros_like(group)
    g = np.exp(np.minimum(lam * np.log(np.maximum(1.0 + r * z, h_min)), 80.0))
    g = np.exp(g - g.max())
    out[start : start + group_size] = group_size * g / g.sum()
  return out


def lambda_grpo_surrogate(lam, rewards, lengths, group_size, r=1.0):
  weights = lambda_grpo_weights(lengths, group_size, lam, r)
  lengths = np.asarray(lengths, np.float64)
  return -np.sum(weights * grpo(rewards, group_size) * lengths) / max(lengths.sum(), 1.0)
