"""Every setting of a training run, with its default and its meaning: the base each
experiment config overrides (`experiments/*.py`), and itself the quickstart's config (SFT warm
start, then GRPO on 2-digit addition with a tiny transformer, on a CPU).

  from jaxcredit.train import base_config
  config = base_config.get_config()
  config.task.name = "key_token"  # ...then override what differs

`python -m jaxcredit.train --help` lists every field with its meaning.
"""

import ml_collections

from jaxcredit import forward

def get_config() -> ml_collections.ConfigDict:
  """The base config: every field the trainer reads, at its default (each commented).

  Returns:
    an `ml_collections.ConfigDict`; experiments override what differs.

  Examples:
    >>> from jaxcredit.train import base_config
    >>> config = base_config.get_config()
    >>> config.task.name, config.rl.group_size > 1
    ('arithmetic', True)
  """
  config = ml_collections.ConfigDict()
  config.seed = 0  # model init, data order and sampling

  config.task = ml_collections.ConfigDict()
  config.task.name = "arithmetic"  # arithmetic | countdown | key_token
  # a+b= with 2-digit operands, answer reversed; held_out: the test split's tenth of the 8,100
  # problems never appears in training.
  config.task.options = {"min_digits": 2, "max_digits": 2, "reverse_answer": True,
                         "held_out": 0.1}
  config.task.train_size = 20000  # training problems
  config.task.test_size = 500  # held-out problems for greedy eval
  config.task.max_prompt_length = 10  # BOS + "999+999=" fits (key_token: fixed by its options)
  config.task.max_response_length = 6  # 4 answer digits + EOS, plus slack (key_token: fixed)
  config.task.truncated_reward = 0.0  # reward of a response cut off by max_response_length (no EOS)
  # Refuse to start if more of a split's prompts exceed max_prompt_length.
  config.task.max_dropped_fraction = 0.1
  # Stop (after saving a checkpoint) when the reward function raises on this fraction of a
  # step's responses or more (1.0: a whole batch); every step with a failure is reported.
  config.task.max_reward_failures = 1.0
  config.task.data_dir = ml_collections.config_dict.placeholder(str)  # default: WORKDIR/data
  # Greedy eval on the first eval_size held-out problems (None: every one that fits, once).
  config.task.eval_size = ml_collections.config_dict.placeholder(int)
  # A Hugging Face tokenizer directory for pretrained tasks (None: model.checkpoint's).
  config.task.tokenizer = ml_collections.config_dict.placeholder(str)

  config.mesh = ml_collections.ConfigDict()
  # (data, fsdp, sequence, model) device counts; None puts every device on `data`.
  config.mesh.shape = ml_collections.config_dict.placeholder(tuple)
  # Overlapped sampling: the sampler's own (data, fsdp, sequence, model) devices, split off
  # after mesh.shape's; it samples batch t + 1 during update t (jaxcredit.train.overlap).
  config.mesh.sampler_shape = ml_collections.config_dict.placeholder(tuple)
  config.mesh.distributed = False  # call jax.distributed.initialize() (multi-host TPU/GPU)
  # With distributed: process 0's "host:port", the process count and this process's id
  # (None: detected on TPU pods, SLURM and other clusters jax knows).
  config.mesh.coordinator_address = ml_collections.config_dict.placeholder(str)
  config.mesh.num_processes = ml_collections.config_dict.placeholder(int)
  config.mesh.process_id = ml_collections.config_dict.placeholder(int)

  config.model = ml_collections.ConfigDict()
  config.model.preset = "tiny"  # 2 layers, d=128 (vocab set by the tokenizer)
  # TransformerConfig fields replacing the preset's (e.g. {"n_layers": 1}).
  config.model.overrides = {}
  # A local Hugging Face checkpoint directory to start from (None: the preset, random weights).
  config.model.checkpoint = ml_collections.config_dict.placeholder(str)
  config.model.random_init = False  # True: the checkpoint's architecture only, random weights
  # Compute dtype (e.g. "bfloat16"; None: the preset's); parameters and Adam state stay float32.
  config.model.dtype = ml_collections.config_dict.placeholder(str)
  # Attention: "chunked" (blockwise, any backend) | "xla" | "cudnn" (GPUs) | "splash" (TPUs);
  # None: the preset's.
  config.model.attention = ml_collections.config_dict.placeholder(str)
  # Rematerialisation: "block" keeps each layer's input only and recomputes the rest in the
  # backward pass (None: the preset's).
  config.model.remat = ml_collections.config_dict.placeholder(str)
  # Scan over stacked layers (None: the preset's).
  config.model.scan_layers = ml_collections.config_dict.placeholder(bool)

  config.sft = ml_collections.ConfigDict()
  config.sft.max_steps = 600  # at most: SFT ends at target_accuracy (after 230-410 steps here)
  config.sft.batch_size = 256  # sequences per step
  config.sft.learning_rate = 1e-3  # Adam
  config.sft.eval_every = 10  # steps between greedy evals
  # Stop SFT once greedy accuracy reaches this (1.0: run max_steps). RL then starts from a
  # policy that solves some problems (outcome reward has signal) with the rest to learn.
  config.sft.target_accuracy = 0.3
  config.sft.noise = 0.0  # fraction of demonstrations with one token replaced by another action

  config.rl = ml_collections.ConfigDict()
  config.rl.steps = 300  # RL steps
  config.rl.prompts_per_step = 32  # prompts per step
  config.rl.group_size = 8  # responses per prompt
  config.rl.temperature = 1.0  # sampling temperature
  config.rl.learning_rate = 1e-4  # Adam; >= 1e-3 collapses here
  config.rl.max_grad_norm = 1.0  # global-norm clipping
  config.rl.epochs = 1  # passes over each batch
  config.rl.minibatches = 1  # updates per pass, each on whole groups (shuffled when > 1)
  # > 0: r_t -= coef * KL_t (for return-based estimators: gae, reinforce, reinforce_pp).
  config.rl.kl_reward_coef = 0.0
  config.rl.kl_reward_kind = "k1"  # KL estimator of that penalty: k1 | k2 | k3
  config.rl.eval_every = 20  # steps between greedy evals
  # Greedy eval decodes this many prompts at a time (None: all at once).
  config.rl.eval_batch_size = ml_collections.config_dict.placeholder(int)
  # The log-prob head reads at most this many logits at a time (from hidden states in chunks).
  config.rl.logits_per_chunk = forward.LOGITS_PER_CHUNK
  # Print the learner step's memory per device from its compiled program at the first step
  # (XLA's memory_analysis: arguments, outputs, temporaries); costs one more compilation.
  config.rl.report_memory = False
  # True: one extra forward pass per step gives rollout.old_logprobs (the learner's own log-probs
  # before its updates; the off-policy losses need them) and the mismatch/... metrics.
  config.rl.recompute_old_logprobs = False
  # k > 0: update t's rollouts are sampled with the parameters after update t - k ("fixed") or
  # t - U{0..k} ("uniform"), recorded per sample as rollout.staleness; 0 is synchronous RL.
  config.rl.max_staleness = 0
  config.rl.staleness_mode = "fixed"  # fixed | uniform | periodic (t - 1 mod k, + 1)
  config.rl.sync_every = 1  # with mesh.sampler_shape: updates between weight pushes to the sampler

  # Tree rollouts (jaxcredit.sampling.sample_tree): a prompt's rl.group_size responses are the
  # leaves of a tree, roots * branching^depth of them, that share prefixes (the tree
  # estimators spo_tree, treerl, tempo, treepo and tree_grpo read it). fork: "none"
  # (independent responses), "fixed" (segments of segment_tokens, the last one the rest of
  # the budget), "delimiter" (a segment also ends after the delimiter token) or "entropy"
  # (it also ends before a token whose entropy reaches entropy_threshold nats); a multi-turn
  # task's episodes fork between turns, every segment_turns turns ("turns").
  config.rollout = ml_collections.ConfigDict()
  # The sampler: "static" (one batch, every row decoded until the longest ends) or "continuous"
  # (rollout.slots rows decoded at once, a slot taking the next response as soon as its own
  # ends - jaxcredit.sampling.generate_continuous -, or a multi-turn task's next episode -
  # MultiTurn.slots -; None: a quarter of the rows).
  config.rollout.engine = "static"
  config.rollout.slots = ml_collections.config_dict.placeholder(int)
  # Partial rollouts (continuous engine): a step decodes at most this many steps, then learns
  # from the oldest whole groups that have finished; responses still running go on in the next
  # step under the newer policy (jaxcredit.rollout_sources.PartialRollouts). None: off.
  config.rollout.partial_decode_steps = ml_collections.config_dict.placeholder(int)
  config.rollout.tree = ml_collections.ConfigDict()
  config.rollout.tree.fork = "none"
  config.rollout.tree.roots = 1
  config.rollout.tree.branching = 2
  config.rollout.tree.depth = 1
  config.rollout.tree.segment_tokens = 8
  config.rollout.tree.delimiter = ml_collections.config_dict.placeholder(int)
  config.rollout.tree.entropy_threshold = ml_collections.config_dict.placeholder(float)
  config.rollout.tree.segment_turns = 1

  config.critic = ml_collections.ConfigDict()
  # A separate value model (for gae / n_step / vtrace); None trains no critic.
  config.critic.preset = ml_collections.config_dict.placeholder(str)
  config.critic.learning_rate = 1e-4  # Adam, one step per policy update
  config.critic.value_clip = 0.2  # PPO value clipping around the sampling-time values
  config.critic.gamma = 1.0  # discount of the critic's targets
  # lambda of the critic's targets (1: Monte-Carlo returns; decoupled from the advantage's).
  config.critic.lam = 1.0

  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every = 50  # RL steps between (async, atomic) checkpoints
  config.checkpoint.keep = 2  # checkpoints kept

  # Weights & Biases (pip install 'jaxcredit[wandb]'): the run's scalars and config are also
  # logged to `project` ("": off), under WORKDIR/wandb; a resumed run continues the same run.
  config.wandb = ml_collections.ConfigDict()
  config.wandb.project = ""
  config.wandb.entity = ""  # "": the account's default
  config.wandb.mode = "online"  # "offline": written under WORKDIR/wandb only (`wandb sync`)

  config.export = ml_collections.ConfigDict()
  # True: write the final policy to WORKDIR/hf as a transformers checkpoint.
  config.export.hf = False
  # Per-token export (jaxcredit.train.export; python -m jaxcredit.view WORKDIR shows it): every
  # `every` RL steps (0: never), `groups` whole groups of the batch as WORKDIR/tokens/*.parquet,
  # with the advantages of the `compare` estimators on the same batch ("oracle": key_token's
  # exact credit).
  config.export.every = 50
  config.export.groups = 4
  config.export.compare = ("rloo",)

  config.advantage = {"name": "grpo"}  # estimators.from_config
  config.objective = {
    "policy": {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2}
  }  # losses.from_config
  return config
