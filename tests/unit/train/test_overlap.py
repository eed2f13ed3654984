"""Overlapped sampling and learning on 8 CPU devices split 4 + 4: the sampler's devices
sample batch t + 1 during update t, and the run equals the one-mesh run with the same
("periodic") staleness; a stopped run resumes exactly; bad splits name the field."""

import json
import subprocess
import sys

import numpy as np
import pytest

from jaxcredit.models import sharding
from jaxcredit.train import refusals
from tests.conftest import ROOT, load_experiment, python_path, xla_flags

SCRIPT = """
import json, pathlib, sys
import jax
from jaxcredit.models import sharding
from jaxcredit.train import loop, overlap
from tests.unit.train.test_staleness import _config, _train_records

sampled_on = set()
sample = overlap.Sampler.sample
def recording_sample(self, batch, key, rl_step):
  rollout = sample(self, batch, key, rl_step)
  sampled_on.update(d.id for d in rollout.tokens.devices())
  return rollout
overlap.Sampler.sample = recording_sample

def config(steps, **rl):
  config = _config(steps, recompute_old_logprobs=True, **rl)
  config.objective = {"policy": {"name": "decoupled_ppo", "cap": 5.0}}
  config.mesh.shape = (4, 1, 1, 1)
  return config

def overlapped(steps):
  c = config(steps, sync_every=2)
  c.mesh.sampler_shape = (4, 1, 1, 1)
  return c

def continuous(c):
  c.rollout.engine, c.rollout.slots = "continuous", 5
  return c

workdir = pathlib.Path(sys.argv[1])
loop.run(overlapped(4), str(workdir / "overlapped"))
loop.run(config(4, max_staleness=2, staleness_mode="periodic"), str(workdir / "simulated"))
loop.run(overlapped(2), str(workdir / "resumed"))  # stops after update 2: a weight push is due
loop.run(overlapped(4), str(workdir / "resumed"))
loop.run(continuous(overlapped(4)), str(workdir / "overlapped_continuous"))
loop.run(continuous(config(4, max_staleness=2, staleness_mode="periodic")),
         str(workdir / "simulated_continuous"))
try:
  sharding.split_meshes((4, 1, 1, 1), (3, 1, 1, 1))
  split_error = None
except ValueError as error:
  split_error = str(error)
print(json.dumps({"records": {name: _train_records(workdir / name)
                              for name in ("overlapped", "simulated", "resumed",
                                           "overlapped_continuous", "simulated_continuous")},
                  "sampled_on": sorted(sampled_on), "split_error": split_error}))
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory, cli_env):
  env = {**cli_env, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8"),
         "PYTHONPATH": python_path(ROOT)}
  result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path_factory.mktemp("overlap"))],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def _assert_records_equal(got: list[dict], want: list[dict]) -> None:
  assert len(got) == len(want)
  for step, (a, b) in enumerate(zip(got, want)):
    assert a.keys() == b.keys(), (step, a.keys() ^ b.keys())
    for key in b:
      np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-5, err_msg=f"{step} {key}")


def test_overlapped_run_equals_the_simulated_staleness_run(report):
  """sync_every = 2: batches 1, 2, 3 are 1, 2, 1 updates stale, sampled on devices 4-7."""
  records = report["records"]
  assert [r["train/staleness_mean"] for r in records["overlapped"]] == [0.0, 1.0, 2.0, 1.0]
  assert report["sampled_on"] == [4, 5, 6, 7]
  gaps = [r["train/mismatch/abs_logp_diff"] for r in records["overlapped"]]
  assert gaps[0] < 1e-5 < min(gaps[1:]), gaps  # stale batches are sampled off-policy
  _assert_records_equal(records["overlapped"], records["simulated"])


def test_overlapped_run_resumes_with_the_parameters_its_next_batch_was_sampled_with(report):
  """(The first part ends with an evaluation the uninterrupted run does not make.)"""
  resumed, straight = ([{k: v for k, v in r.items() if k != "eval/accuracy"} for r in records]
                       for records in (report["records"]["resumed"],
                                       report["records"]["overlapped"]))
  _assert_records_equal(resumed, straight)


def test_the_overlapped_sampler_samples_with_the_continuous_engine(report):
  """rollout.engine = 'continuous' on the sampler's devices: the run equals the simulated one
  with the same engine and differs from the static sampler's (its keys are per response)."""
  records = report["records"]
  overlapped = records["overlapped_continuous"]
  assert [r["train/staleness_mean"] for r in overlapped] == [0.0, 1.0, 2.0, 1.0]
  _assert_records_equal(overlapped, records["simulated_continuous"])
  assert overlapped[0]["train/entropy"] != records["overlapped"][0]["train/entropy"]


def test_a_split_that_does_not_use_every_device_names_both_fields(report):
  assert report["split_error"] == (
      "mesh.shape (4, 1, 1, 1) (learner, 4 devices) and mesh.sampler_shape (3, 1, 1, 1) "
      "(3 devices) must split the 8 devices between them.")


@pytest.mark.parametrize("field, value, message", [
    ("rl.sync_every", 0, "rl.sync_every must be an int >= 1, got 0"),
    ("mesh.sampler_shape", (4, 1), r"mesh.sampler_shape gives the sizes of \(data, fsdp"),
    ("rl.max_staleness", 2, "rl.max_staleness must be 0 with mesh.sampler_shape"),
])
def test_bad_overlap_settings_name_the_field(field, value, message):
  config = load_experiment("quickstart")
  config.mesh.sampler_shape = (1, 1, 1, 1)
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ValueError, match=message):
    refusals.validate_config(config)


def test_a_sampler_needs_devices_of_its_own():
  with pytest.raises(ValueError, match="must split the 1 devices between them"):
    sharding.split_meshes(None, (1, 1, 1, 1))
