"""Does token-level credit matter? The credit study on key_token, and on target_sum in the
full preset (studies.credit_study.sweep): regimes x samples per prompt G x arms at equal generated
tokens.

  python -m studies.credit_study --config studies/credit_study/configs.py:smoke --workdir DIR  # CI
  python -m studies.credit_study --config studies/credit_study/configs.py:small --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:primary --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:stalls --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:entropy --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:ktae_prime --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:ktae_shared --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:mc_ladder --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:mc_granularity \\
      --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:critic --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:regimes --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:budgets --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:language --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:scale --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:mid_filler --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:mid_filler_Z3 \\
      --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:same_rate --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:trainers --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:entropy_sums \
      --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:rate_grid --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:tuning_full \
      --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:tuning_g32 \
      --workdir DIR
  python -m studies.credit_study --config studies/credit_study/configs.py:full --workdir DIR
  ... --config.run_regimes="('uniform_filler',)"   # some regimes now, the others later

(studies/credit_study/configs_v1.py is the first design: one learning rate, 3 seeds, a step
count, the full trainer; studies/credit_study/results_v1.)

Every arm trains the same policies (per seed: initialisation, prompt draws, sampling keys)
from the random policy (or after a short SFT that sets the regime), with RMS-scaled
advantages and one plain policy-gradient step per batch; its learning rate is tuned per
regime on seeds excluded from the report. The arms:
  grpo, dr_grpo              sequence-level credit (broadcast to every token); rloo is
                             dr_grpo times G / (G - 1): the same arm once advantages are
                             RMS-scaled (every response has T tokens), so it is not run
  oracle                     the exact A(s_t, y_t) (uncharged: an upper bound)
  oracle_seq                 R - V(x): the exact baseline, no localisation
  oracle_shuffled            the exact credit permuted within each response
  entropy80 / entropy80_low  GRPO on the top-20% entropy tokens / on the other 80%
  ktae                       GRPO plus KTAE's key-token score of each token's type in its
                             group (with its term-frequency term)
  prime_prm_R                PRIME: RLOO plus the implicit PRM's process rewards
                             beta (log pi_phi - log pi_ref), the PRM and the reference
                             copies of the starting policy (after the regime's SFT), the PRM
                             trained on each batch's outcomes with Adam at rate R (1e-3 to
                             1e-6: at R -> 0 the arm is RLOO; how fast the PRM should learn
                             is part of the question)
  ppo_gae                    GAE (lambda = 0.95) over a learned critic: the policy's
                             architecture with a value head, its trunk copied from the
                             starting policy, regressed on the returns (PPO value clipping)
                             every update; its ranking of the alternative keys at the
                             decisive positions is scored against the exact values
                             (VinePPO's test)
  oracle_mc_K                plain Monte-Carlo credit at every token: V-hat(s_t) from K
                             continuations of each action's state (K in 1, 4, 16, 64), each
                             action credited V-hat(s_(t+1)) - V-hat(s_t); its runs sample as
                             many tokens as the others and are also charged the
                             continuations' K T (T + 1) / 2 tokens per response (compared
                             at equal charged tokens in a table of their own)
  mc_K_stride_S, mc_K_cut    VinePPO at practical granularity: V-hat(s_t) from K
                             continuations at every S-th action of a response only, or at
                             SPO's cutpoints (actions with pi(y_t) < 0.9, and the first);
                             each segment's tokens share its V-hat(next) - V-hat(start)
                             (compared with GRPO at equal charged FLOPs)
The small preset runs the core arms (CORE: broadcast credit, exact credit, the exact baseline
without localisation, and localisation destroyed); the full preset adds the others (a full
run trains the arms a small run's cells lack and reads the rest back).
"""

import ml_collections

PRESETS = ("smoke", "small", "primary", "stalls", "entropy", "ktae_prime", "mc_ladder",
           "mc_granularity", "critic", "regimes", "budgets", "language", "scale", "mid_filler",
           "mid_filler_Z3", "same_rate", "trainers", "ktae_shared", "forecast", "entropy_sums",
           "rate_grid", "tuning_full", "tuning_g32", "warm_start", "stalls_mid", "full")

ARMS = {
    "grpo": "grpo",
    "dr_grpo": "dr_grpo",
    "ppo_gae": {"name": "gae", "lam": 0.95},
    "oracle": "oracle",
    "oracle_seq": "oracle_seq",
    "oracle_shuffled": "oracle_shuffled",
    "entropy80": {"mask": "high_entropy", "rho": 0.2, "of": "grpo"},
    "entropy80_low": {"mask": "low_entropy", "rho": 0.2, "of": "grpo"},
    "ktae": "ktae",
    **{f"prime_prm_{rate}": "prime" for rate in ("1e-3", "1e-4", "1e-5", "1e-6")},
    **{f"oracle_mc_{k}": {"name": "vineppo", "k": k, "positions": "all"} for k in (1, 4, 16, 64)},
    **{f"mc_{k}_stride_6": {"name": "vineppo", "k": k, "positions": "stride:6"} for k in (1, 4)},
    **{f"mc_{k}_cut": {"name": "vineppo", "k": k, "positions": "cutpoints:0.9"} for k in (1, 4)},
}
# The forecast's arms beside GRPO, oracle and oracle_seq: the exact credit without what it
# learns from groups whose every response failed (a group baseline gets nothing there).
FORECAST_ARMS = {"grpo": "grpo", "oracle_seq": "oracle_seq", "oracle": "oracle",
                 **{f"{arm}_no_failed": {"mask": "groups_with_success", "of": arm}
                    for arm in ("oracle", "oracle_seq")}}
# Same-rate controls: a core arm at another arm's tuned rate (`fixed_learning_rates`).
SAME_RATE = {"grpo_at_1e-3": ("grpo", 1e-3), "oracle_at_1e-3": ("oracle", 1e-3),
             "oracle_seq_at_3e-3": ("oracle_seq", 3e-3)}
ARMS.update({name: ARMS[arm] for name, (arm, _) in SAME_RATE.items()})
# The rate grid: each core arm at every rate of the tuning grid, GRPO at its tuned 1e-3 (both
# filler regimes') the reference every arm is compared with.
RATE_GRID = {f"{arm}_at_{rate}": (arm, float(rate)) for arm in ("grpo", "oracle", "oracle_seq")
             for rate in ("3e-4", "1e-3", "3e-3", "1e-2") if (arm, rate) != ("grpo", "1e-3")}
ARMS.update({name: ARMS[arm] for name, (arm, _) in RATE_GRID.items()})
MC_LADDER = tuple(name for name in ARMS if name.startswith("oracle_mc_"))
MC_GRANULARITY = ("mc_1_stride_6", "mc_4_stride_6", "mc_1_cut", "mc_4_cut")
PRIME = tuple(name for name in ARMS if name.startswith("prime_"))
SCALE_REGIMES = ("uniform_filler_d64", "peaked_filler_d64", "uniform_filler_B16",
                 "peaked_filler_B16")
CORE = ("grpo", "oracle", "oracle_seq", "oracle_shuffled")
# The experiment-config trainer's key_token policy (configs_v1.py), over the study's.
TRAINER_POLICY = {"n_layers": 2, "d_model": 64, "d_ff": 256}
# The presets that run some of the full preset's regimes, with the core arms (at every G
# but for scale and mid_filler_Z3, at G = 8):
SOME_REGIMES = {
    # The regimes that this 2-core CPU runs in about an hour (2 workers): visible filler
    # (E-TREE, T = 8) and the start at J = 0.3. target_sum's E-TREE teacher-forces 1,024
    # paths per prompt at every update (8,192 sequences beside 64 samples at G = 8) and
    # T = 96 / 384 scale the tokens 4x / 16x: those run on an accelerator.
    "regimes": ("visible_filler_T8", "start_at_0_3"),
    # On peaked filler GRPO needs 1.7-2.1x fewer tokens than the budget to reach 0.9 x the
    # plateau (the protocol asks a budget >= 3x that): those cells again at twice the
    # budget, tuning included.
    "budgets": ("peaked_filler_Z2",),
    # The language-like task alone (zipf_explain, T = 128). Its Monte-Carlo oracle decodes
    # 4 continuations from each of a response's 18 cuts at every update (72x the sampled
    # rows) and its SFT runs at T = 128: for an accelerator.
    "language": ("zipf_explain_T128",),
    # H2's other two axes at the primary G only: both filler regimes with a policy of twice
    # the width (d = 64, about 4x the parameters) and with twice the prompts per update
    # (16, at the same generated tokens: half the updates), 10 seeds.
    "scale": SCALE_REGIMES,
    # Filler entropy between the two filler regimes (0.29 nats after SFT, against 1.39 and
    # 0.02).
    "mid_filler": ("mid_filler",),
    # On mid_filler GRPO reaches 0.9 x the best plateau in 2-3 of 10 seeds within the budget
    # (1.3-1.7x its tokens there): the primary G again at three times the budget, tuning
    # included, to tell a slower start from a lower plateau.
    "mid_filler_Z3": ("mid_filler_Z3",),
    "same_rate": ("mid_filler_Z3",),  # the same-rate controls (below)
    "warm_start": ("start_at_0_3",),  # the start at J = 0.3 read at log-spaced updates
    "stalls_mid": ("mid_filler",),  # stalls at 40 seeds on middling filler
}


def get_config(preset: str = "small") -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; known: {', '.join(PRESETS)}.")
  config = ml_collections.ConfigDict()
  config.preset = preset
  # Two decisive positions (8 and 16) in 24 tokens; |C| = 4: chance success 1/16.
  task = {"length": 24, "n_decisive": 2, "n_keys": 4, "n_fillers": 4, "rule": "all",
          "filler_blind": True}
  config.regimes = {
      "uniform_filler": {"task": task},  # the random policy: filler near ln 4 = 1.39 nats
      # A short SFT on filler drawn 99.75% as F0 (0.02 nats) and uniform keys: confident
      # filler, success still at chance.
      "peaked_filler": {"task": task,
                        "warmup": {"steps": 300, "filler_probs": [0.9975] + [0.0025 / 3] * 3,
                                   "key_accuracy": 0.0}},
  }
  # One layer, d = 32 (about 17k parameters): it learns to copy the keys within the budget.
  config.model = {"preset": "tiny",
                  "overrides": {"n_layers": 1, "d_model": 32, "n_heads": 4, "n_kv_heads": 4,
                                "d_ff": 128}}
  config.group_sizes = (4, 8, 16, 32)  # a tuple: --config.group_sizes='(4, 8)' runs some
  config.prompts_per_step = 8
  # Generated tokens per run, by G (the same for every arm of a cell): about 3x what GRPO
  # needed to reach 0.9 x the best plateau in a first measurement on uniform filler (343k,
  # 382k and 528k tokens at G = 4, 8, 16; G = 32 extrapolated); the report checks it per cell.
  config.token_budget = {"4": 1_100_000, "8": 1_200_000, "16": 1_600_000, "32": 2_400_000}
  config.tuning_group_size = 8  # each arm's learning rate is chosen here, per regime, ...
  config.tuning_token_budget = 600_000  # ...at this budget (GRPO reaches 0.9 x in ~400k)
  config.eval_points = 20  # exact J measured this many times (and at the start)...
  config.eval_spacing = "linear"  # ...evenly, or "log": evenly in log updates
  config.eval_prompts = 256  # every prompt when |C|^K is at most this
  config.arms = {name: ARMS[name] for name in CORE}
  # The implicit PRM's Adam rate of each PRIME arm (a setting the arm's runs record).
  config.prm_learning_rates = {name: float(name.removeprefix("prime_prm_")) for name in PRIME}
  config.learning_rates = [3e-4, 1e-3, 3e-3, 1e-2]
  # Arms that take a given rate instead of the tuned one (the same-rate controls).
  config.fixed_learning_rates = {}
  config.tuning_seeds = [100, 101]  # choose the learning rate; excluded from the report
  config.tuning_criterion = "auc"  # the rate of the best mean AUC ("auc+final": AUC + final J)
  config.seeds = list(range(10))
  config.margin = 0.05  # TOST equivalence margin on J
  config.mechanism_batches = 4  # fresh batches per measurement of the gradients, taken...
  config.mechanism_evals = (0, 3, 20)  # ...at these evaluations: start, 15% of Z, end
  # Pieces (tuning, cells) run side by side in this many processes, one CPU core each: on
  # this 2-core CPU 1.25x the tokens/s of one process on both cores (bench.sweep). 1 on an
  # accelerator.
  config.workers = 2
  # Runs per compiled program (None: a piece's runs in one): 40 holds a small cell (4 arms
  # x 10 seeds); a G = 32 cell's program then takes 5.1 GiB of XLA temporaries (bench.sweep),
  # two side by side within 24 GiB.
  config.runs_per_program = 40
  # Regimes to run now (None: all); the others are listed as not run. A later run with more
  # resumes the finished ones.
  config.run_regimes = ml_collections.config_dict.placeholder(tuple)

  if preset == "primary":
    # The primary cell, G = 8 in both filler regimes with the core arms, at 20 paired seeds:
    # run in a copy of the small preset's workdir (as for the entropy preset below) it reads
    # seeds 0-9 back and trains 10-19 (a cell grows run by run).
    config.group_sizes = (8,)
    config.seeds = list(range(20))
  if preset == "stalls":
    # Stalls as an outcome where they occur (peaked filler; GRPO stalled in 5 of 20 primary
    # seeds at G = 8, the exact credit in 1): GRPO and the exact credit at 40 paired seeds,
    # each run's keys recorded after its last update (what a stall is), J at log-spaced
    # updates. A fresh workdir.
    config.regimes = {"peaked_filler": config.regimes["peaked_filler"]}
    config.arms = {name: ARMS[name] for name in ("grpo", "oracle")}
    config.group_sizes = (8,)
    config.seeds = list(range(40))
    config.eval_points = 30
    config.eval_spacing = "log"
    config.mechanism_batches = 0
    config.workers = 1  # the cell waits for its tuning: one process on both cores
  if preset == "entropy":
    # The 80/20 check (arXiv 2506.01939: GRPO's gradient on the 20% of tokens of highest
    # entropy matches or beats all tokens; on the other 80% it falls behind) at G = 8 in
    # both filler regimes, beside the core arms. The small preset's cells under other arms:
    # run in a copy of its workdir, it reads the core arms back and trains the two new ones.
    config.arms = {name: ARMS[name] for name in (*CORE, "entropy80", "entropy80_low")}
    config.group_sizes = (8,)
  if preset == "entropy_sums":
    # The 80/20 check where it is not true by construction: on key_token the confident
    # filler leaves the keys as the high-entropy tokens; on target_sum every digit can
    # decide the sum and the policy's uncertainty lies wherever it learns to hesitate.
    # GRPO, entropy80 and its bottom-80% control, tuned, G = 8, 10 seeds (no exact credit:
    # target_sum's E-TREE would teacher-force 1,024 paths per prompt at every update).
    config.regimes = {"target_sum": _full_regimes(config.regimes.to_dict(), task)["target_sum"]}
    config.arms = {name: ARMS[name] for name in ("grpo", "entropy80", "entropy80_low")}
    config.group_sizes = (8,)
    config.workers = 1
  if preset == "rate_grid":
    # Fair learning rates: every core arm at every rate of the grid on the reported seeds of
    # the primary cells (G = 8, both filler regimes), so no contrast rests on a rate chosen
    # by 2 tuning seeds at half the budget. A fresh workdir; nothing is tuned.
    config.arms = {"grpo": ARMS["grpo"], **{name: ARMS[name] for name in RATE_GRID}}
    config.fixed_learning_rates = {"grpo": 1e-3, **{name: rate for name, (_, rate)
                                                     in RATE_GRID.items()}}
    config.group_sizes = (8,)
    config.mechanism_batches = 0
    config.workers = 1
  if preset in ("tuning_full", "tuning_g32"):
    # Tuning as the protocol asks: the core arms' rates chosen on 5 excluded seeds at the
    # cell's full budget by AUC + final J (a rate at which a run rises fast and then falls
    # is not chosen for its speed), then the primary cells (G = 8, both filler regimes) at
    # those rates. The rate_grid preset holds every arm at every rate on the same reported
    # seeds. A fresh workdir.
    config.arms = {name: ARMS[name] for name in ("grpo", "oracle", "oracle_seq")}
    config.tuning_seeds = [100, 101, 102, 103, 104]
    config.tuning_token_budget = None  # the tuning G's budget
    config.tuning_criterion = "auc+final"
    config.group_sizes = (8,)
    config.mechanism_batches = 0
    config.workers = 1  # the cell waits for its tuning: one process on both cores
  if preset == "tuning_g32":
    # Is the rate chosen at G = 8 near-optimal at G = 32? The same tuning as tuning_full's,
    # at G = 32 and its budget, then the G = 32 cells at the rates chosen there (the
    # primary G = 32 cells in results/cells ran at G = 8's).
    config.tuning_group_size = 32
    config.group_sizes = (32,)
  if preset == "ktae_prime":
    # KTAE (arXiv 2505.16826) and PRIME (arXiv 2502.01456, its PRM at four rates) beside
    # the core arms at G = 8 in both filler regimes; read back as above.
    config.arms = {name: ARMS[name] for name in (*CORE, "ktae", *PRIME)}
    config.group_sizes = (8,)
    config.runs_per_program = 30  # three PRIME arms x 10 seeds: no padding to 40 runs
  if preset == "mc_ladder":
    # The Monte-Carlo ladder: how much of the exact credit's gain survives K
    # continuations per state, at equal samples and at equal charged tokens, at G = 8 in both
    # filler regimes beside the core arms (read back from a copy of the small preset's
    # workdir, as for the entropy preset).
    config.arms = {name: ARMS[name] for name in (*CORE, *MC_LADDER)}
    config.group_sizes = (8,)
  if preset == "mc_granularity":
    # VinePPO at practical granularity on peaked filler at G = 8, against GRPO and VinePPO
    # at every action (K = 4) at equal charged FLOPs: V-hat at every 6th action (4 of the 24:
    # 0, 6, 12, 18, none of them decisive) or at the cutpoints (pi(y_t) < 0.9: at the start
    # the keys, not the confident filler; whatever filler training makes less confident
    # later). A fresh workdir: each run records its charged FLOPs, and J is
    # measured at log-spaced updates so an arm charged 10x is read early in its run.
    config.regimes = {"peaked_filler": config.regimes["peaked_filler"]}
    config.arms = {name: ARMS[name] for name in ("grpo", "oracle_mc_4", *MC_GRANULARITY)}
    config.group_sizes = (8,)
    config.eval_points = 30
    config.eval_spacing = "log"
    config.runs_per_program = 30
  if preset == "critic":
    # A learned critic (PPO-GAE) beside the core arms at G = 8 in both filler regimes, and
    # how well it ranks alternative steps against Monte-Carlo values of the same states
    # (VinePPO: barely better than chance); read back as for the entropy preset.
    config.arms = {name: ARMS[name] for name in (*CORE, "ppo_gae")}
    config.group_sizes = (8,)
    config.runs_per_program = 10  # one new arm x 10 seeds: no padding to 40 runs
    config.workers = 1  # a regime's cell waits for its tuning: one process on both cores
  if preset in ("full", *SOME_REGIMES):
    config.regimes = _full_regimes(config.regimes.to_dict(), task)
    config.arms = {name: arm for name, arm in ARMS.items() if name not in SAME_RATE}
    config.workers = 1
  if preset in SOME_REGIMES:
    config.regimes = {name: config.regimes[name] for name in SOME_REGIMES[preset]}
    config.arms = {name: ARMS[name] for name in CORE}
    # One regime at one G (mid_filler_Z3) is a chain (its cell waits for its tuning): one
    # process on both cores. language: for an accelerator.
    config.workers = 1 if preset in ("language", "mid_filler_Z3") else 2
  if preset in ("scale", "mid_filler_Z3", "same_rate"):
    config.group_sizes = (8,)
  if preset == "same_rate":
    # The middling-filler contrast at three times the budget with every core arm at each
    # of the two rates the tuning chose there (GRPO and exact credit 3e-3, oracle_seq
    # 1e-3): run in a copy of the mid_filler_Z3 preset's workdir, it reads the tuned arms
    # back and trains the three controls.
    config.arms = {name: ARMS[name] for name in (*CORE, *SAME_RATE)}
    config.fixed_learning_rates = {name: rate for name, (_, rate) in SAME_RATE.items()}
    config.workers = 1
    config.runs_per_program = 30  # the three controls x 10 seeds
  if preset == "ktae_shared":
    # KTAE with token types not tied to positions: filler drawn from the key alphabet
    # (shared_alphabet: F := C), so a key symbol's statistics in a group mix its decisive
    # and its filler occurrences; uniform filler at G = 8 beside GRPO and exact credit,
    # tuned as usual. A fresh workdir.
    config.regimes = {"uniform_filler_shared": {"task": {**task, "shared_alphabet": True}}}
    config.arms = {name: ARMS[name] for name in ("grpo", "oracle", "ktae")}
    config.group_sizes = (8,)
    config.workers = 1  # the cell waits for its tuning: one process on both cores
    config.runs_per_program = 30
  if preset == "warm_start":
    # The start at J = 0.3 resolved: the regimes preset measured J at 20 evenly spaced
    # updates, and every arm was at 0.84-0.95 by the first. GRPO and the exact credit at the
    # rates the regimes preset's tuning chose there (3e-3 and 1e-2), the exact credit also at
    # GRPO's rate (a same-rate control), J at 30 log-spaced updates. A fresh workdir;
    # nothing is tuned.
    config.arms = {name: ARMS[name] for name in ("grpo", "oracle", "oracle_at_3e-3")}
    config.fixed_learning_rates = {"grpo": 3e-3, "oracle": 1e-2,
                                   "oracle_at_3e-3": RATE_GRID["oracle_at_3e-3"][1]}
    config.eval_points = 30
    config.eval_spacing = "log"
    config.mechanism_batches = 0
    config.runs_per_program = 30
  if preset == "stalls_mid":
    # Stalls as an outcome on middling filler, where GRPO stalled in 6 of 10 seeds at G = 8
    # at its AUC-tuned rate (3e-3): GRPO and the exact credit at 40 paired seeds, both at
    # 1e-3, the rate at which each ended highest in the same-rate control (same_rate), so
    # that a stall is not the rate's; each run's keys recorded after its last update, J at
    # log-spaced updates. A fresh workdir; nothing is tuned.
    config.arms = {name: ARMS[name] for name in ("grpo", "oracle")}
    config.fixed_learning_rates = {"grpo": 1e-3, "oracle": 1e-3}
    config.group_sizes = (8,)
    config.seeds = list(range(40))
    config.eval_points = 30
    config.eval_spacing = "log"
    config.mechanism_batches = 0
    config.workers = 1
  if preset == "trainers":
    # One answer from both trainers: the cells of configs_v1.py's `trainers` preset (the
    # experiment-config trainer, jaxcredit.train) in the batched lab with the same policy
    # (two layers, d = 64) and the same rate for every arm (1e-3, untuned), from the random
    # policy, 300 updates of 8 prompts at G = 8 and 32, J every 25 updates; and at the
    # study's policy (one layer, d = 32): the depth-and-width factor.
    config.regimes = {"trainer_policy": {"task": task, "model_overrides": TRAINER_POLICY},
                      "study_policy": {"task": task}}
    config.arms = {name: ARMS[name] for name in ("grpo", "oracle")}
    config.group_sizes = (8, 32)
    config.token_budget = {str(g): 300 * 8 * g * task["length"] for g in config.group_sizes}
    config.eval_points = 12
    config.learning_rates = [1e-3]
    config.fixed_learning_rates = {name: 1e-3 for name in config.arms}
    config.mechanism_batches = 0
    config.mechanism_evals = None
    config.workers = 1
    config.runs_per_program = 20
  if preset == "forecast":
    # The mechanism's pre-registered forecast (studies/credit_study/forecast.py): filler
    # regimes x reward rules, each a regime whose SFT's key accuracy the forecast sets per
    # starting success p0 (P(every key right)); one rate for every arm.
    fillers = {"uniform_sft": [0.25] * 4, "mid_filler": [0.94] + [0.02] * 3,
               "peaked_filler": [0.9975] + [0.0025 / 3] * 3}
    config.regimes = {
        f"{filler}_{rule}": {"task": {**task, "rule": rule},
                             "warmup": {"steps": 300, "filler_probs": probs,
                                        "key_accuracy": 0.0}}
        for filler, probs in fillers.items() for rule in ("all", "count")}
    config.arms = dict(FORECAST_ARMS)
    config.forecast = {
        "fillers": tuple(fillers), "rules": ("all", "count"),
        "start_success": (1 / 16, 0.1, 0.2, 0.3, 0.5), "half_success": 0.5,
        "calibration_accuracies": (0.0, 0.25, 0.5, 0.75, 1.0),
        "batches": 8, "threshold": 0.9,
        # Every arm at 1e-3 from the random policy, rule all, uniform filler, G = 8.
        "calibration": "studies/credit_study/results/trainers/cells/study_policy/G8.json",
        # The cells the forecast is scored on, drawn once all are predicted, and their runs.
        "held_out": 24, "training_seeds": (0, 1, 2, 3, 4), "budget_range": (100, 1000),
        "stage": "forecast"}  # then "train", then "score" (forecast.py)
    config.seeds = list(range(4))
    config.learning_rates = [1e-3]
    config.fixed_learning_rates = {name: 1e-3 for name in config.arms}
    config.mechanism_batches = 0
    config.mechanism_evals = None
    config.eval_spacing = "log"
    config.eval_points = 30
    config.workers = 1
  if preset == "smoke":
    config.regimes = {"uniform_filler": {"task": {"length": 6, "n_decisive": 2, "n_keys": 3,
                                                  "n_fillers": 2, "filler_blind": True}}}
    config.model.overrides = {"n_layers": 1, "d_model": 32, "n_heads": 2, "n_kv_heads": 2,
                              "d_ff": 64}
    config.group_sizes = (2, 4)
    config.tuning_group_size = 2
    config.prompts_per_step = 4
    config.token_budget = {"2": 960, "4": 960}
    config.tuning_token_budget = None  # G = 2's budget
    config.eval_points = 2
    config.arms = {name: ARMS[name] for name in ("grpo", "oracle", "oracle_seq", "oracle_mc_4")}
    config.learning_rates = [1e-3, 1e-2]
    config.tuning_seeds = [100]
    config.seeds = [0, 1]
    config.mechanism_batches = 2
    config.mechanism_evals = None  # every evaluation
    config.workers = 1
    config.runs_per_program = None
  return config


def _full_regimes(regimes: dict, task: dict) -> dict:
  """The small preset's regimes (T = 24, under their names: a full run resumes their cells)
  and the rest of the protocol's: T in {96, 384} x filler {uniform, peaked} (the budget
  scales with T: the same number of updates), peaked filler at twice the budget, filler of
  middling entropy, the
  language-like task (zipf_explain, T = 128), both filler regimes with a wider policy and
  with more prompts per update, a start at J = 0.3 (keys right 40% of the
  time after the SFT: (0.4 + 0.6 / 4)^2 = 0.30), visible filler, target_sum. About 14
  billion generated tokens in all: 30 hours or more on a 2-core CPU at the small preset's
  rate, so one accelerator (workers = 1), in pieces (run_regimes)."""
  regimes = dict(regimes)
  for length in (96, 384):
    long_task = {**task, "length": length}
    regimes[f"uniform_filler_T{length}"] = {"task": long_task, "budget_scale": length / 24}
    regimes[f"peaked_filler_T{length}"] = {**regimes["peaked_filler"], "task": long_task,
                                           "budget_scale": length / 24}
  regimes["peaked_filler_Z2"] = {**regimes["peaked_filler"], "budget_scale": 2}
  # Filler between uniform (1.39 nats) and peaked (0.02): an SFT on F0 94% of the time,
  # -0.94 ln 0.94 - 3 (0.02 ln 0.02) = 0.29 nats.
  regimes["mid_filler"] = {"task": task, "warmup": {
      "steps": 300, "filler_probs": [0.94] + [0.02] * 3, "key_accuracy": 0.0}}
  regimes["mid_filler_Z3"] = {**regimes["mid_filler"], "budget_scale": 3}
  for filler in ("uniform_filler", "peaked_filler"):  # H2's model and batch size
    regimes[f"{filler}_d64"] = {**regimes[filler],
                                "model_overrides": {"d_model": 64, "d_ff": 256}}
    regimes[f"{filler}_B16"] = {**regimes[filler], "prompts_per_step": 16}
  regimes["start_at_0_3"] = {"task": task, "warmup": {
      "steps": 300, "filler_probs": [0.25] * 4, "key_accuracy": 0.4}}
  # Visible filler: later keys' conditionals read earlier filler, which can then carry
  # credit; the exact oracle is E-TREE over 2^(p_K - 1) = 16 paths per prompt (T = 8).
  regimes["visible_filler_T8"] = {
      "task": {**task, "length": 8, "n_fillers": 2, "filler_blind": False},
      "budget_scale": 8 / 24}
  # target_sum: up to 6 digits in 0..3 summing to S ~ U[3, 15], EOS allowed;
  # the decisive digits differ from response to response. E-TREE: 4^5 = 1,024 paths per
  # prompt. 7 response slots: the T = 24 cells' updates.
  # The language-like task (zipf_explain): a 128-token explanation in a Zipfian bigram
  # grammar of 32 words whose 2 answers (after MARKs the writer places) decide R, from a
  # policy SFT'd for 1,200 steps on the grammar's demonstrations, their answers at chance.
  # J and the credit are the Rao-Blackwellised Monte-Carlo oracle's (tasks.zipf_explain.oracle).
  # The budget scales with T.
  regimes["zipf_explain_T128"] = {
      "task_name": "zipf_explain",
      "task": {"length": 128, "n_answers": 2, "n_keys": 4, "n_words": 32},
      "warmup": {"steps": 1200, "key_accuracy": 0.0}, "budget_scale": 128 / 24}
  regimes["target_sum"] = {"task_name": "target_sum", "task": {
      "n_digits": 6, "n_values": 4, "target_low": 3, "target_high": 15}, "budget_scale": 7 / 24}
  return regimes
