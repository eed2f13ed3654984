"""The training CLI as a subprocess, on a tiny key_token run (shared by the CLI tests)."""

import json
import subprocess
import sys

from tests.conftest import ROOT

KEY_TOKEN = [  # a tiny key_token run from the random policy
  "--config.task.name=key_token",
  "--config.task.options={'length': 10, 'n_keys': 4, 'filler_blind': True}",
  "--config.task.train_size=64",
  "--config.task.test_size=16",
  "--config.sft.max_steps=0",
  "--config.rl.prompts_per_step=4",
  "--config.rl.group_size=4",
]
TINY = [
  *KEY_TOKEN,
  "--config.rl.eval_every=2",
  "--config.checkpoint.every=1",
  "--config.checkpoint.keep=4",
]


def command(workdir, *overrides, config="experiments/quickstart.py", tiny=True) -> list[str]:
  return [
    sys.executable,
    "-m",
    "jaxcredit.train",
    "--config",
    str(ROOT / config),
    "--workdir",
    str(workdir),
    *(TINY if tiny else ()),
    *overrides,
  ]


def train(workdir, *overrides, env=None, timeout=300, **kwargs) -> subprocess.CompletedProcess:
  return subprocess.run(
    command(workdir, *overrides, **kwargs),
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=timeout,
    check=False,
    env=env,
  )


def metrics(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
