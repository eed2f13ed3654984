"""GRPO on GSM8K from a pretrained instruct checkpoint (Qwen2.5, Qwen3 or Llama 3.2).

  python -m jaxcredit.train --config experiments/gsm8k_grpo.py \\
      --config.model.checkpoint=/ckpt/Qwen2.5-0.5B-Instruct --config.task.jsonl_dir=/data/gsm8k \\
      --workdir /runs/gsm8k
  --config experiments/gsm8k_grpo.py:qwen3    # Qwen3-0.6B shape, thinking off in the template
  --config experiments/gsm8k_grpo.py:llama3   # Llama-3.2-1B shape
  --config experiments/gsm8k_grpo.py:smoke    # 2 small layers, short lengths: a CPU check

On disk: a checkpoint directory (config.json, *.safetensors, tokenizer.json,
tokenizer_config.json with its chat template, generation_config.json) and
GSM8K's train.jsonl / test.jsonl. With --config.model.random_init=True the
architecture (the checkpoint's config.json, or the variant's preset when no
checkpoint is given) starts from random weights: for throughput and memory
measurements; the tokenizer then comes from --config.task.tokenizer.
"""


import ml_collections

from jaxcredit.train import base_config

VARIANTS = {
  # variant: (architecture preset without a checkpoint, chat-template variables)
  "qwen2.5": ("qwen2.5-0.5b", {}),
  "qwen3": ("qwen3-0.6b", {"enable_thinking": False}),  # Qwen3's template: answer without <think>
  "llama3": ("llama3.2-1b", {}),
  "smoke": ("qwen2.5-0.5b", {}),  # scaled down below
}


def get_config(variant: str = "qwen2.5") -> ml_collections.ConfigDict:
  if variant not in VARIANTS:
    raise ValueError(f"Unknown gsm8k_grpo variant {variant!r}; known: {', '.join(VARIANTS)}.")
  architecture, template_variables = VARIANTS[variant]
  config = base_config.get_config()
  placeholder = ml_collections.config_dict.placeholder

  task = config.task
  task.name = "gsm8k"
  del task.options, task.train_size, task.test_size  # the JSONL files are the data
  task.jsonl_dir = placeholder(str)  # directory with GSM8K's train.jsonl and test.jsonl
  task.tokenizer = placeholder(str)  # tokenizer directory; default: model.checkpoint
  task.prompt = "chat"  # chat: the checkpoint's chat template | plain: BOS + question
  task.system_prompt = placeholder(str)  # optional system message
  # Appended to each question; the reward reads the number right after the last '####'.
  task.instruction = "\nSolve it step by step, then give the final answer as '#### <number>'."
  task.template_variables = template_variables  # extra chat-template variables
  task.max_prompt_length = 256  # chat-templated question; start-up counts and reports any longer
  task.max_response_length = 768  # reasoning budget; a response without EOS here scores 0
  task.eval_size = 256  # greedy eval on the first 256 test problems (None: all 1,319)

  model = config.model
  model.preset = architecture  # the architecture when no checkpoint is given
  model.checkpoint = placeholder(str)  # a local Hugging Face checkpoint directory
  model.random_init = False  # True: the architecture only, random weights (no weights needed)
  model.dtype = "bfloat16"  # compute dtype; parameters and Adam state stay float32
  model.attention = "chunked"  # blockwise (flash) attention, any backend; "cudnn" on GPUs; "xla"
  model.remat = "block"  # the backward keeps each layer's input only and recomputes the rest

  config.sft.max_steps = 0  # an instruct model: RL from the checkpoint, no warm start

  rl = config.rl
  rl.steps = 200  # RL steps
  rl.prompts_per_step = 32  # prompts per step
  rl.group_size = 8  # responses per prompt (GRPO's group)
  rl.temperature = 1.0  # sampling temperature
  rl.learning_rate = 1e-6  # Adam, as in GRPO recipes for 0.5B-3B models
  rl.minibatches = 4  # 4 updates per batch of 256 responses (64 each)
  rl.eval_every = 25  # steps between greedy evals
  rl.eval_batch_size = 64  # greedy eval decodes this many prompts at a time
  rl.logits_per_chunk = 2**26  # log-probs from hidden states, 2^26 logits (~441 tokens) at a time

  config.checkpoint.every = 25  # RL steps between checkpoints
  config.export.hf = True  # WORKDIR/hf: the final policy as a transformers checkpoint

  config.advantage = {"name": "grpo"}  # (R - mean_group) / std_group on every token
  config.objective = {
    "policy": {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28}
  }  # DAPO's clip-higher

  if variant == "smoke":  # a CPU check of the whole path in seconds
    model.overrides = {
      "n_layers": 2,
      "d_model": 64,
      "n_heads": 4,
      "n_kv_heads": 1,
      "d_ff": 128,
      "vocab_size": 1024,
    }
    task.max_prompt_length, task.max_response_length, task.eval_size = 160, 8, 4
    rl.steps, rl.prompts_per_step, rl.group_size, rl.minibatches = 2, 2, 4, 2
    rl.eval_every, rl.eval_batch_size = 2, 4
    config.checkpoint.every = 2
  return config
