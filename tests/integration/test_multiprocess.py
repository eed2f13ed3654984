"""A real multi-process run: the scaling guide's multi-host command as written, on two
processes on localhost joined by jax.distributed.initialize (CPU collectives over gloo), trains
the quickstart task, stops at a checkpoint, resumes, and matches a single-process run, per-token
export included; a refusal on process 0 stops every process."""

import re
import shlex
import socket
import subprocess
import sys

import numpy as np
import pandas as pd

from tests import cli
from tests.conftest import doc_block, xla_flags
from tests.integration.test_train import ROOT, _train_lines

SIZES = [  # batches of 64 rows: 4 on each of the multi-host command's 16 devices
  "--config.task.train_size=512",
  "--config.task.test_size=64",
  "--config.sft.max_steps=2",
  "--config.sft.batch_size=64",
  "--config.sft.eval_every=2",
  "--config.rl.prompts_per_step=16",
  "--config.rl.group_size=4",
  "--config.rl.eval_every=2",
  "--config.checkpoint.every=1",
  "--config.task.truncated_reward=-1.0",  # mixed rewards from the start: non-zero updates
  "--config.export.every=2",
]


def _command(workdir, *overrides):
  return [
    sys.executable,
    "-m",
    "jaxcredit.train",
    "--config",
    str(ROOT / "experiments/quickstart.py"),
    "--workdir",
    str(workdir),
    *SIZES,
    *overrides,
  ]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _two_processes(workdir, env, *overrides, command=None):
  """Both processes' (returncode, stdout, stderr) running `command` (default: the quickstart
  with SIZES) with `overrides`, joined on localhost. Output goes to files: a full pipe would
  block one process while the other waits for it in a collective."""
  port = _free_port()
  command = command or _command(workdir)
  logs = [
    (workdir.parent / f"process{i}.out", workdir.parent / f"process{i}.err") for i in range(2)
  ]
  processes = []
  for i, (out, err) in enumerate(logs):
    with open(out, "w") as stdout, open(err, "w") as stderr:
      processes.append(
        subprocess.Popen(
          [
            *command,
            *overrides,
            "--config.mesh.distributed=True",
            f"--config.mesh.coordinator_address=localhost:{port}",
            "--config.mesh.num_processes=2",
            f"--config.mesh.process_id={i}",
          ],
          stdout=stdout,
          stderr=stderr,
          text=True,
          cwd=ROOT,
          env={
            **env,
            "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
            # one compilation cache per process: none reads an entry another is writing
            "JAX_COMPILATION_CACHE_DIR": f"{env['JAX_COMPILATION_CACHE_DIR']}-process{i}",
          },
        )
      )
  codes = [p.wait(timeout=600) for p in processes]
  return [(code, out.read_text(), err.read_text()) for code, (out, err) in zip(codes, logs)]


def _diagnosis(stderr: str) -> str:
  """The end of a failed process's stderr, less the list of extension modules
  that Python's fatal-error handler appends (it would push the cause out)."""
  return stderr.split("\nExtension modules:")[0][-4000:]


def _tokens(workdir) -> pd.DataFrame:
  return pd.read_parquet(workdir / "tokens").sort_values(["step", "group", "sample", "position"])


def _documented_multi_host_command(workdir) -> list[str]:
  """The scaling guide's multi-host command, with `workdir` for its workdir."""
  block = doc_block("--config.mesh.distributed=True", "bash")
  commands = " ".join(block.replace("\\\n", " ").splitlines()).split("python -m ")
  words = shlex.split(
    next(c for c in commands if "--config.mesh.distributed=True" in c), comments=True
  )
  words[words.index("--workdir") + 1] = str(workdir)
  return [sys.executable, "-m", *words]


def test_the_documented_multi_host_command_resumes_and_matches_one_process(tmp_path, cli_env):
  """The command as the scaling guide writes it (its mesh over two processes' CPU devices), at
  a small run's sizes: it stops at the checkpoint of step 2, resumes to step 4 and matches a
  one-device run in this process (which reads nothing of the process itself), per-token export
  included: process 0 writes the export and the metrics."""
  command = _documented_multi_host_command(tmp_path / "pod")
  assert "--config.export.every=0" not in command
  shape = next(w for w in command if w.startswith("--config.mesh.shape="))
  devices = int(np.prod([int(n) for n in re.findall(r"\d+", shape)]))
  devices_per_process = f"--xla_force_host_platform_device_count={devices // 2}"
  env = {**cli_env, "XLA_FLAGS": xla_flags(devices_per_process), "JAX_LOG_COMPILES": "1"}
  single = cli.in_process(_command(tmp_path / "single", "--config.rl.steps=4")[3:])
  assert single.returncode == 0, single.stderr[-3000:]
  for steps in (2, 4):  # the second run resumes from the first one's checkpoint at step 2
    results = _two_processes(tmp_path / "pod", env, *SIZES, f"--config.rl.steps={steps}",
                             command=command)
    for code, _, stderr in results:
      assert code == 0, _diagnosis(stderr)
      # Updates keep the parameters' placement (fsdp shards some, replicates the norms): each
      # program compiles once, not again for the next step's inputs. The sampler's two are
      # greedy evaluation and sampling; SFT runs before the checkpoint only.
      compiles = {name: stderr.count(f"Compiling jit({name}) ")
                  for name in ("sft_update", "learner_step", "_generate_cached")}
      assert compiles == {"sft_update": int(steps == 2), "learner_step": 1, "_generate_cached": 2}
  assert all("Resuming RL at step 2" in stdout for _, stdout, _ in results)
  assert "[Gloo] Rank 1 is connected to 1 peer ranks" in results[1][1]
  want, got = _train_lines(tmp_path / "single"), _train_lines(tmp_path / "pod")
  assert [line["step"] for line in got] == [line["step"] for line in want]  # process 0 writes once
  assert len(got) == 4 and any(abs(line["train/grad_norm"]) > 1e-3 for line in want)
  for a, b in zip(want, got):
    for key in ("train/reward_mean", "train/loss", "train/grad_norm", "train/kl", "train/entropy"):
      assert abs(a[key] - b[key]) < 1e-4, (key, a["step"], a[key], b[key])
  assert (tmp_path / "pod" / "checkpoints" / "4").exists()
  # The per-token export: process 0 writes the rows both processes computed, as one process does.
  want, got = _tokens(tmp_path / "single"), _tokens(tmp_path / "pod")
  assert sorted(set(got["rl_step"])) == [2, 4] and len(got) == len(want)
  for column in want.columns:  # null off actions in both
    if want[column].dtype.kind == "f":
      np.testing.assert_allclose(got[column], want[column], atol=1e-4, err_msg=column)
    else:
      np.testing.assert_array_equal(got[column], want[column], err_msg=column)


def test_a_refusal_on_process_0_stops_every_process_with_its_line(tmp_path, cli_env):
  """Process 0 alone builds the task; when it refuses the task's settings, the others stop
  with the same line instead of waiting for data that never comes."""
  results = _two_processes(tmp_path / "refused", cli_env, "--config.task.options={'digits': 3}")
  for code, _, stderr in results:
    assert code == 1, _diagnosis(stderr)
    assert ("Stopped: task.options has 'digits', which ArithmeticConfig does not take") in stderr
    assert "Traceback" not in stderr, _diagnosis(stderr)
