"""GRPO on GSM8K from a pretrained checkpoint (experiments/gsm8k_grpo.py).

The checkpoint is a small random Qwen2 model built and saved by transformers
beside a tokenizer trained offline; the data are GSM8K-format JSONL lines.
"""

import json
import pathlib
import random
import shlex
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxcredit import tasks  # noqa: E402
from jaxcredit.tasks import HFTokenizer  # noqa: E402
from jaxcredit.train import loop, setup  # noqa: E402
from tests import cli  # noqa: E402
from tests.conftest import ROOT, doc_block, load_experiment  # noqa: E402
from tests.hf_tokenizers import save_qwen_style  # noqa: E402


def _write_gsm8k(
  directory: pathlib.Path, sizes=(("train", 24), ("test", 8)), seed=0
) -> pathlib.Path:
  rng = random.Random(seed)
  directory.mkdir(parents=True, exist_ok=True)
  for split, n in sizes:
    lines = []
    for _ in range(n):
      a, b = rng.randint(2, 99), rng.randint(2, 99)
      lines.append(
        json.dumps(
          {
            "question": f"Natalia sold {a} clips in April and {b} in May. How many did she sell?",
            "answer": f"She sold {a} + {b} = <<{a}+{b}={a + b}>>{a + b} clips.\n#### {a + b}",
          }
        )
      )
    (directory / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
  return directory


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("gsm8k")
  return save_qwen_style(root / "tokenizer"), _write_gsm8k(root / "data")


def _smoke_config(tokenizer, data, **task):
  config = load_experiment("gsm8k_grpo", "smoke")
  config.task.tokenizer, config.task.jsonl_dir = str(tokenizer), str(data)
  config.task.update(task)
  return config


def test_prompts_are_the_checkpoints_chat_template_and_rewards_read_the_final_number(
  files, tmp_path
):
  tokenizer_dir, data = files
  config = _smoke_config(tokenizer_dir, data)
  task = tasks.make(config.task, data_dir=str(tmp_path), seed=0, tokenizer=str(tokenizer_dir))
  reference = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
  example = task.sources["train"][0]
  question = example["prompt"].decode()
  prompt, completion = task.encode(example)
  messages = [{"role": "user", "content": question + config.task.instruction}]
  assert prompt == list(
    reference.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
  )
  assert reference.decode(prompt).endswith("<|im_start|>assistant\n")
  assert completion[-1] == reference.convert_tokens_to_ids("<|im_end|>")
  assert task.stop_tokens == (reference.convert_tokens_to_ids("<|im_end|>"),)
  assert task.pretrained_vocab and task.vocab_size == len(reference)

  answer = example["answer"].decode()
  ours = HFTokenizer(tokenizer_dir)
  rows = [
    ours.encode(f"so {answer} in all\n#### {answer}", add_eos=True),
    ours.encode(f"#### {int(answer) + 1}", add_eos=True),
    ours.encode(f"#### {answer}"),
  ]  # right, but cut off by the budget: no EOS
  width = task.max_prompt_length + max(map(len, rows))
  tokens = np.full((3, width), task.pad_id)
  mask = np.zeros((3, width), bool)
  for row, ids in enumerate(rows):
    tokens[row, task.max_prompt_length : task.max_prompt_length + len(ids)] = ids
    mask[row, task.max_prompt_length : task.max_prompt_length + len(ids)] = True
  np.testing.assert_array_equal(task.score_rows(tokens, mask, [example] * 3), [1.0, 0.0, 0.0])


def test_plain_prompts_and_bad_settings(files, tmp_path):
  tokenizer_dir, data = files
  plain = tasks.make(
    _smoke_config(tokenizer_dir, data, prompt="plain").task,
    data_dir=str(tmp_path),
    seed=0,
    tokenizer=str(tokenizer_dir),
  )
  example = plain.sources["test"][0]
  assert HFTokenizer(tokenizer_dir).decode(plain.encode(example)[0]) == (
    example["prompt"].decode() + load_experiment("gsm8k_grpo", "smoke").task.instruction
  )
  config = _smoke_config(tokenizer_dir, data)
  with pytest.raises(ValueError, match="needs a Hugging Face tokenizer"):
    tasks.make(config.task, data_dir=str(tmp_path), seed=0, tokenizer=None)
  with pytest.raises(ValueError, match="task.prompt"):
    tasks.make(
      _smoke_config(tokenizer_dir, data, prompt="xml").task,
      data_dir=str(tmp_path),
      seed=0,
      tokenizer=str(tokenizer_dir),
    )
  small = _smoke_config(tokenizer_dir, data).model
  small.overrides = {**small.overrides, "vocab_size": 100}
  with pytest.raises(
    ValueError, match=r"vocabulary \(100 ids\) is smaller than the task tokenizer's"
  ):
    setup.policy(small, plain, seed=0)
  with pytest.raises(ValueError, match="test.jsonl"):
    tasks.make(
      _smoke_config(tokenizer_dir, tmp_path / "empty").task,
      data_dir=str(tmp_path),
      seed=0,
      tokenizer=str(tokenizer_dir),
    )


def test_edited_data_are_prepared_afresh(files, tmp_path):
  tokenizer_dir, _ = files
  data = _write_gsm8k(tmp_path / "data", seed=1)
  make = lambda: tasks.make(
    _smoke_config(tokenizer_dir, data).task,
    data_dir=str(tmp_path / "prepared"),
    seed=0,
    tokenizer=str(tokenizer_dir),
  )
  before = make().sources["train"][0]["prompt"]
  _write_gsm8k(data, seed=2)
  assert make().sources["train"][0]["prompt"] != before
  assert len(list((tmp_path / "prepared").glob("gsm8k-*"))) == 2


def _readme_smoke_command() -> list[str]:
  """The documented smoke command (its bash lines joined), as argv."""
  block = doc_block("gsm8k_grpo.py:smoke", "bash").replace("\\\n", " ")
  line = next(l for l in block.splitlines() if "gsm8k_grpo.py:smoke" in l)
  return shlex.split(line)


def _run_readme_smoke_command(files, workdir, *overrides,
                              here: bool = False) -> subprocess.CompletedProcess:
  """The documented smoke command with this test's paths (and `overrides` appended), in a
  process of its own, or with `here` in this one (`tests.cli.in_process`)."""
  tokenizer_dir, data = files
  command = _readme_smoke_command()
  assert (
    command[:3] == ["python", "-m", "jaxcredit.train"]
    and "--config.model.random_init=True" in command
  )
  paths = {
    "--workdir": workdir,
    "--config.task.tokenizer": tokenizer_dir,
    "--config.task.jsonl_dir": data,
  }
  argv = [*command[3:], *overrides]
  for i, arg in enumerate(argv):
    for flag, path in paths.items():
      if arg == flag:
        argv[i + 1] = str(path)
      elif arg.startswith(flag + "="):
        argv[i] = f"{flag}={path}"
  if here:
    return cli.in_process(argv)
  return subprocess.run([sys.executable, *command[1:3], *argv], capture_output=True, text=True,
                        cwd=ROOT, timeout=600, check=False)


@pytest.mark.parametrize(
  "overrides,message",
  [
    (
      ["--config.task.eval_size=0"],
      "task.eval_size (None: every test problem) must be a positive int, got 0",
    ),
    (
      ["--config.task.eval_size=-1"],
      "task.eval_size (None: every test problem) must be a positive int, got -1",
    ),
    (
      ["--config.model.random_init=False", "--config.model.checkpoint={tokenizer}"],
      "model.overrides sets d_ff, d_model, n_heads, n_kv_heads, n_layers, vocab_size, "
      "which change the shape",
    ),
  ],
)
def test_the_smoke_command_refuses_unusable_settings_naming_them(
  files, tmp_path, overrides, message
):
  overrides = [o.format(tokenizer=files[0]) for o in overrides]
  result = _run_readme_smoke_command(files, tmp_path / "run", *overrides, here=True)
  assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_readme_smoke_command_trains_and_exports(files, tmp_path):
  result = _run_readme_smoke_command(files, tmp_path / "run")
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert max(r["step"] for r in records) == 2
  assert any("train/reward_mean" in r for r in records) and any(
    "eval/accuracy" in r for r in records
  )
  exported = tmp_path / "run" / "hf"
  assert (exported / "chat_template.jinja").exists() and (exported / "tokenizer.json").exists()
  model = transformers.AutoModelForCausalLM.from_pretrained(exported)
  assert model.config.num_hidden_layers == 2 and model.config.vocab_size == 1024


def test_training_starts_from_the_checkpoint(files, tmp_path):
  """A run whose updates round away exports exactly the checkpoint it loaded."""
  tokenizer_dir, data = files
  checkpoint_dir = tmp_path / "checkpoint"
  hf_config = transformers.Qwen2Config(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    tie_word_embeddings=True,
    rope_theta=1e6,
  )
  torch.manual_seed(0)
  original = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
  original.save_pretrained(checkpoint_dir)
  for file in tokenizer_dir.iterdir():
    (checkpoint_dir / file.name).write_bytes(file.read_bytes())
  config = _smoke_config(tokenizer_dir, data)
  config.task.tokenizer = None  # taken from the checkpoint directory
  config.model.checkpoint, config.model.overrides = str(checkpoint_dir), {}
  config.model.dtype = "float32"
  config.rl.steps, config.rl.learning_rate = 1, 1e-30  # updates far below float32 resolution
  final = loop.run(config, str(tmp_path / "run"))
  assert final["step"] == 1
  exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf").eval()
  tokens = torch.as_tensor(np.random.default_rng(0).integers(0, 1024, (2, 64)))
  with torch.no_grad():
    np.testing.assert_array_equal(exported(tokens).logits.numpy(), original(tokens).logits.numpy())


def test_a_padded_vocabulary_is_never_sampled_and_the_learner_agrees(files, tmp_path):
  """The smoke model has 1,024 embedding rows for the tokenizer's 428 ids: the sampler is
  restricted to the tokenizer's ids (a random policy would draw 58% of its tokens beyond
  them) and the learner's log-probs are normalised over the same set."""
  import pandas as pd

  tokenizer_dir, data = files
  config = _smoke_config(tokenizer_dir, data)
  config.model.random_init, config.model.dtype = True, "float32"
  config.rl.recompute_old_logprobs, config.export.every = True, 1
  loop.run(config, str(tmp_path / "run"))
  vocab = HFTokenizer(tokenizer_dir).vocab_size
  assert vocab < config.model.overrides["vocab_size"]
  tokens = pd.read_parquet(tmp_path / "run" / "tokens")
  actions = tokens[tokens["is_action"]]
  assert len(actions) and actions["token_id"].max() < vocab
  assert not tokens["token"].str.startswith("<id ").any()
  records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  gaps = [r["train/mismatch/abs_logp_diff"] for r in records if "train/mismatch/abs_logp_diff" in r]
  assert gaps and max(gaps) < 1e-4, gaps
