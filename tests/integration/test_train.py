"""The training CLI end to end on a few steps (a smoke run, not a learning check)."""

import contextlib
import io
import json
import math
import pathlib
import re

import pytest

from jaxcredit.models import load_hf_checkpoint, stop_tokens
from jaxcredit.tasks import CharTokenizer, arithmetic
from tests import cli
from tests.cli import KEY_TOKEN
from tests.conftest import documentation, load_experiment, xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_metrics_writer_keeps_an_earlier_run(tmp_path):
  from jaxcredit.train.metrics import MetricsWriter

  MetricsWriter(tmp_path).write(0, {"eval/accuracy": 0.5})
  MetricsWriter(tmp_path).write(0, {"eval/accuracy": 0.25})
  files = sorted(p.name for p in tmp_path.glob("metrics*.jsonl"))
  assert len(files) == 2 and "metrics.jsonl" in files
  assert json.loads((tmp_path / "metrics.jsonl").read_text())["eval/accuracy"] == 0.25


def _metrics(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _train_lines(workdir):
  return [line for line in _metrics(workdir) if "train/reward_mean" in line]


def test_plot_cli(tmp_path):
  from jaxcredit import plot

  for name, scale in (("grpo", 1.0), ("rloo", 0.5)):
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "eval/accuracy": scale * s / 10}) + "\n" for s in range(0, 50, 10)))
  out = tmp_path / "curves.png"
  plot.main(
    [str(tmp_path / "grpo"), str(tmp_path / "rloo"), "--metric", "eval/accuracy", "--out", str(out)]
  )
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert plot.read_metric(tmp_path / "rloo", "eval/accuracy") == (
    [0, 10, 20, 30, 40],
    [0.0, 0.5, 1.0, 1.5, 2.0],
  )
  import pytest

  with pytest.raises(ValueError, match="has no 'train/loss' entries"):
    plot.read_metric(tmp_path / "grpo", "train/loss")
  with pytest.raises(ValueError, match="No metrics.jsonl"):
    plot.read_metric(tmp_path, "eval/accuracy")


EXPERIMENTS = [
  "quickstart",
  "dr_grpo",
  "rloo",
  "reinforce_pp",
  "gspo",
  "dapo",
  "credit_mix",
  "ppo_gae",
  "countdown_grpo",
  "countdown_continuous",
  "key_token_grpo",
  "key_token_treepo",
  "key_turns_grpo",
  "key_turns_tree_grpo",
  "key_turns_long",
  "key_turns_32k",
  "calculator_grpo",
  "target_sum_grpo",
  "lambda_grpo",
  "gsm8k_grpo",
]


def test_every_experiment_is_the_base_config_with_overrides():
  """Each experiment holds every field the loop reads (base_config's, but a task's own data
  fields), and no field the base does not define outside `task` (a task's own settings)."""
  from jaxcredit.train import base_config, refusals

  base = refusals._field_names(base_config.get_config())
  for name in EXPERIMENTS:
    config = load_experiment(name)
    refusals.check_complete(config)
    extra = {f for f in refusals._field_names(config) - base if not f.startswith("task.")}
    assert not extra, (name, extra)
  assert load_experiment("quickstart").to_dict() == base_config.get_config().to_dict()


def test_a_config_missing_a_base_field_is_refused_naming_it():
  from jaxcredit.train import refusals

  config = load_experiment("rloo")
  del config.rl["eval_batch_size"], config.model["remat"]
  with pytest.raises(ValueError, match=r"The config lacks model\.remat, rl\.eval_batch_size: "
                                       r"build it on jaxcredit\.train\.base_config"):
    refusals.validate_config(config)
  config = load_experiment("rloo")
  del config.task["options"], config.task["train_size"]  # a task's data fields may go
  refusals.check_complete(config)
  config = load_experiment("gsm8k_grpo", "smoke")  # which reads files
  assert "options" not in config.task
  refusals.check_complete(config)


def test_the_log_prob_chunk_must_be_a_positive_int():
  from jaxcredit.train import refusals

  for value in (None, 0):
    config = load_experiment("quickstart")
    config.rl.logits_per_chunk = value
    message = f"rl.logits_per_chunk must be a positive int, got {value}"
    with pytest.raises(ValueError, match=message):
      refusals.validate_config(config)


def test_every_experiment_builds_its_advantage_and_objective():
  import jax
  import numpy as np

  import jaxcredit as jc
  from jaxcredit import estimators, losses, testing

  rollout = testing.strategies.make_rollout(
    np.random.default_rng(0), batch=8, length=6, group_size=4
  )
  outputs = jc.PolicyOutputs(
    logprobs=rollout.behaviour_logprobs - 0.01, entropy=rollout.entropy, values=rollout.values
  )
  for name in EXPERIMENTS:
    config = load_experiment(name)
    advantage = (
      config.advantage if isinstance(config.advantage, str) else config.advantage.to_dict()
    )
    estimate = jax.jit(estimators.from_config(advantage))(rollout)
    loss, metrics = jax.jit(losses.from_config(config.objective.to_dict()))(
      outputs, rollout, estimate, 0
    )
    assert np.isfinite(loss) and "loss" in metrics, name


# Every shipped training config, trained for two RL steps with tiny data and batches (the
# study configs run at their smoke presets in their test_lab_* modules, and gsm8k_grpo, which
# needs a checkpoint's tokenizer and JSONL files, at its smoke preset in test_gsm8k_train).
# `loop.run` is what the CLI calls with the parsed config: the configs train in this process
# (their shared programs traced once), and those named in CLI through the CLI's own entry point,
# overrides given as flags: in this process (`cli.in_process`), but for key_turns_32k, which
# needs a process of its own for its 8 host devices.
STUDIES = (
  "credit_study",
  "credit_study_v1",
  "length_bias",
  "staleness_study",
  "start_gradients",
  "turn_study",
)
SHIPPED = sorted(
  p.stem for p in (ROOT / "experiments").glob("*.py") if p.stem not in (*STUDIES, "gsm8k_grpo")
)
CLI = ("quickstart", "key_turns_32k")  # the latter on 8 host devices: a process of its own
SMALL = {  # no SFT (test_multiprocess trains from SFT) but for countdown's noisy demonstrations
  "task.train_size": 64,
  "task.test_size": 8,
  "sft.max_steps": 0,
  "rl.steps": 2,
  "rl.prompts_per_step": 4,
  "rl.group_size": 4,
  "rl.eval_every": 2,
}


def _train(workdir, name: str, overrides: dict, env=None) -> str:
  """Trains experiments/<name>.py with `overrides` in this process, or through the CLI for
  the configs in CLI; returns what the run printed."""
  if name not in CLI:
    from jaxcredit.train import loop

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      config = load_experiment(name)
      config.update_from_flattened_dict(overrides)  # {dotted field: value}
      loop.run(config, str(workdir))
    return stdout.getvalue()
  flags = [f"--config.{path}={value}" for path, value in overrides.items()]
  config = f"experiments/{name}.py"
  if env is None:
    result = cli.train_here(workdir, *flags, config=config, tiny=False)
  else:
    result = cli.train(workdir, *flags, config=config, tiny=False, env=env, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_partial_rollouts_train_and_carry_responses_across_steps(tmp_path):
  _train(tmp_path, "countdown_continuous",
         {**SMALL, "rl.steps": 2, "rollout.partial_decode_steps": 3})
  train = _train_lines(tmp_path)
  assert len(train) == 2 and all(math.isfinite(line["train/loss"]) for line in train)
  # Sampled 3 decode steps per step, responses of up to 64 tokens run on across steps: their
  # first tokens were drawn by older policies.
  assert train[0]["train/staleness_mean"] == 0 and max(
      line["train/staleness_mean"] for line in train) > 0


def test_the_shipped_configs_are_the_documented_ones():
  assert sorted([*SHIPPED, "gsm8k_grpo"]) == sorted(EXPERIMENTS)
  documented = documentation()
  assert all(f"`{name}`" in documented for name in SHIPPED)
  assert set(CLI) <= set(SHIPPED)


def _shipped_overrides(name: str) -> dict:
  """SMALL, and what a config needs besides to train in two tiny steps."""
  overrides = dict(SMALL)
  if name == "quickstart":
    overrides["export.hf"] = True
  if name == "countdown_grpo":
    overrides.update({"sft.max_steps": 2, "sft.batch_size": 8})
  if name == "ppo_gae":  # without SFT every response is wrong; a truncated one scoring -1
    overrides["task.truncated_reward"] = -1.0  # mixes the rewards
  if name.endswith(("treepo", "tree_grpo")):  # a tree's leaves are the group: 1 chain
    overrides["rollout.tree.roots"] = 1  # forking twice into 2 is SMALL's 4
  if name == "key_turns_long":  # 256 turns an episode: 2 groups of 2 episodes, and 2
    # held-out ones; the learner step's memory reported at the start.
    overrides.update({"rl.prompts_per_step": 2, "rl.group_size": 2, "task.test_size": 2,
                      "rl.report_memory": True})
  if name == "key_turns_32k":  # 4 turns of 64 tokens, still split 8 ways along `sequence`,
    # and 8 episodes: one sampled on each device
    overrides.update({"rl.group_size": 2, "task.options.n_turns": 4,
                      "task.options.observation_length": 62, "task.options.decisive": (0, 3)})
  return overrides


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_trains(tmp_path, name, cli_env):
  env = None
  if name == "key_turns_32k":
    env = {**cli_env, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8")}
  stdout = _train(tmp_path, name, _shipped_overrides(name), env=env)
  train = _train_lines(tmp_path)
  assert len(train) == 2 and all(math.isfinite(line["train/loss"]) for line in train)
  assert "eval/accuracy" in train[-1]
  if name == "key_token_treepo":  # the prefix-shared learner pass scores what the tree sampled
    assert abs(train[0]["train/policy/ratio_mean"] - 1.0) < 1e-4
    assert train[0]["train/gen_tokens"] == 4 * (8 + 2 * 8 + 4 * 8)  # shared segments once
  if name == "key_turns_long":  # whole 256-turn episodes, the sampler's view the learner's
    assert train[0]["train/gen_tokens"] == 4 * 256
    assert abs(train[0]["train/policy/ratio_mean"] - 1.0) < 1e-4
    memory = re.search(r"Learner step memory per device \(1 devices\): arguments ([0-9.e-]+) GiB, "
                       r"outputs ([0-9.e-]+) GiB, temporaries ([0-9.e-]+) GiB", stdout)
    assert memory and float(memory[1]) > 0 and float(memory[3]) > 0, stdout[-2000:]
    assert stdout.count("Learner step memory") == 1
  if name == "key_turns_32k":  # whole episodes: 2 action tokens a turn, rows over 8 devices
    assert train[0]["train/gen_tokens"] == 8 * 4 * 2
    assert abs(train[0]["train/policy/ratio_mean"] - 1.0) < 1e-4
    assert "Learner step memory per device (8 devices)" in stdout, stdout[-2000:]
  if name == "quickstart":
    assert all("step" in line for line in _metrics(tmp_path))
    for key in (
      "train/loss",
      "train/entropy",
      "train/kl",
      "train/tokens_per_sec",
      "train/policy/approx_kl",
      "train/zero_variance_groups",
    ):
      assert key in train[-1], key
    assert abs(train[0]["train/policy/ratio_mean"] - 1.0) < 1e-4  # sampler and learner agree
    assert abs(train[0]["train/kl"]) < 1e-5  # the reference is the policy at the start of RL
    assert json.loads((tmp_path / "config.json").read_text())["rl"]["group_size"] == 4
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    # The finished policy, exported in transformers' format (checked against transformers
    # itself in test_hf_parity), loads back with the task's stop token as its EOS.
    exported = load_hf_checkpoint(tmp_path / "hf")
    assert (
      exported.config.vocab_size
      == json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"]
    )
    assert stop_tokens(tmp_path / "hf") == (CharTokenizer(arithmetic.ALPHABET).eos_id,)
  if name == "reinforce_pp":  # the KL reward penalty starts at 0 (policy == reference), then moves
    assert "train/kl/value" in train[-1]
    assert (
      abs(train[0]["train/kl_reward_penalty"]) < 1e-6 and train[1]["train/kl_reward_penalty"] != 0.0
    )
  if name == "credit_mix":  # PRIME's implicit PRM is trained in the rollout hook
    assert "train/hook/prm_loss" in train[-1]
  if name == "ppo_gae":  # metrics are the last of four updates: the policy has moved, not far
    assert 0 < abs(train[0]["train/policy/ratio_mean"] - 1.0) < 0.2
    assert train[0]["train/critic/mse"] > 0 and train[0]["train/critic/grad_norm"] > 0
    assert "train/critic/value_mean" in train[1]


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  # Adam at lr 1e38 overflows the parameters after one update; the next loss is not finite.
  result = cli.train_here(
    tmp_path,
    *KEY_TOKEN,
    "--config.rl.steps=4",
    "--config.rl.eval_every=4",
    "--config.checkpoint.every=1",
    "--config.rl.learning_rate=1e38",
    tiny=False,
  )
  assert result.returncode != 0
  assert "Non-finite loss" in result.stderr and "last good checkpoint is step 1" in result.stderr
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]


def test_model_config_fields_reach_the_policy():
  """model.attention, model.remat and model.scan_layers set the policy's config fields."""
  import types

  from jaxcredit.train import setup

  config = load_experiment("quickstart").model
  task = types.SimpleNamespace(pretrained_vocab=False, vocab_size=32)
  assert setup.policy(config, task, seed=0).config.scan_layers
  config.scan_layers, config.remat = False, "none"
  policy = setup.policy(config, task, seed=0)
  assert not policy.config.scan_layers and policy.config.vocab_size == 32
  config.remat = "block"
  with pytest.raises(ValueError, match="needs scan_layers=True"):
    setup.policy(config, task, seed=0)
