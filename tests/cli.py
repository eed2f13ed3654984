"""The training CLI as a subprocess, on a tiny key_token run (shared by the CLI tests), or in
the test's process for the runs that test nothing of the process itself."""

import contextlib
import io
import json
import subprocess
import sys
from unittest import mock

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


def in_process(argv: list[str]) -> subprocess.CompletedProcess:
  """`python -m jaxcredit.train *argv` in this process: the CLI's own absl entry point (`app.run`
  with its flag parser and `main`), stdout and stderr captured, the exit status and message
  taken from the SystemExit that ends it as the interpreter would write them. It spares a
  run the ~4 s of an interpreter start and imports, and a training run the programs this
  process already compiled; anything but SystemExit leaves it, so a traceback fails the
  calling test."""
  from absl import app, flags, logging

  from jaxcredit.train import __main__ as cli

  argv = ["jaxcredit.train", *argv]
  for name in [name for name in flags.FLAGS if name.startswith("config.")]:
    delattr(flags.FLAGS, name)  # an earlier run's config overrides: this parse defines its own
  flags.FLAGS.unparse_flags()
  stdout, stderr, status, verbosity = io.StringIO(), io.StringIO(), 0, logging.get_verbosity()
  # ml_collections reads the config file's overrides from sys.argv.
  with mock.patch.object(sys, "argv", argv), contextlib.chdir(ROOT), \
       contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    try:
      app.run(cli.main, argv=argv, flags_parser=cli._parse_flags)
    except SystemExit as exit_:
      if isinstance(exit_.code, str):
        print(exit_.code, file=sys.stderr)
      status = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
      logging.set_verbosity(verbosity)
  return subprocess.CompletedProcess(argv, status, stdout.getvalue(), stderr.getvalue())


def train_here(workdir, *overrides, **kwargs) -> subprocess.CompletedProcess:
  """`train(workdir, *overrides, **kwargs)` in this process (`in_process`): for the runs whose
  test reads nothing of the process (its signals, devices, locks or environment)."""
  return in_process(command(workdir, *overrides, **kwargs)[3:])


def metrics(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
