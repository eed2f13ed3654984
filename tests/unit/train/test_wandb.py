"""Weights & Biases beside TensorBoard: with `wandb.project` named, a run's scalars and config go
to a W&B run (here in its offline mode, written under the workdir), and a resumed run continues
the same W&B run."""

import json
import struct

import pytest

from jaxcredit.train import loop, refusals
from tests.conftest import load_experiment

wandb = pytest.importorskip("wandb",
                            reason="wandb is not installed (pip install 'jaxcredit[wandb]')")


def _config(steps: int):
  config = load_experiment("quickstart")
  config.task.update(train_size=64, test_size=16)
  config.sft.max_steps = 2
  config.rl.update(steps=steps, prompts_per_step=4, group_size=2, eval_every=2)
  config.checkpoint.every = 1
  config.export.every = 0
  config.wandb.update(project="jaxcredit-test", mode="offline")
  return config


def _runs(workdir):
  return sorted((workdir / "wandb").glob("offline-run-*"))


def _records(path) -> list:
  """The records of an offline run's .wandb file, decoded with wandb's own protobuf schema. The
  file is a LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks (crc32 [4], length
  [2], type [1]: 1 full, 2 first, 3 middle, 4 last) whose payloads join into records."""
  from wandb.proto import wandb_internal_pb2

  data, block, position, chunks, records = path.read_bytes(), 32 * 1024, 7, b"", []
  while position + 7 <= len(data):
    if block - position % block < 7:  # a block's tail too short for a chunk header is padding
      position += block - position % block
      continue
    _, length, kind = struct.unpack("<IHB", data[position:position + 7])
    chunks += data[position + 7:position + 7 + length]
    position += 7 + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(chunks)
      records.append(record)
      chunks = b""
  return records


def _values(items) -> dict:
  return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def test_offline_runs_hold_the_scalars_and_the_config_and_resume_the_same_run(tmp_path,
                                                                            monkeypatch):
  monkeypatch.setenv("WANDB_SILENT", "true")
  workdir = tmp_path / "run"
  loop.run(_config(steps=2), str(workdir))
  [run] = _runs(workdir)
  [path] = run.glob("run-*.wandb")
  records = _records(path)
  [started] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
  config = _values(started.config.update)
  assert config["rl"]["group_size"] == 2 and config["wandb"]["mode"] == "offline", config.keys()
  logged = {row["_step"]: row for row in (_values(r.history.item) for r in records
                                          if r.WhichOneof("record_type") == "history")}
  written = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert sorted(logged) == sorted({row["step"] for row in written})
  for row in written:  # every scalar of metrics.jsonl, at its step
    for name, value in row.items():
      if name != "step" and value is not None:
        assert logged[row["step"]][name] == pytest.approx(value, rel=1e-6), (row["step"], name)
  assert any("train/loss" in row for row in logged.values())
  run_id = (workdir / "wandb_run_id").read_text()
  assert run.name.endswith(run_id) and started.run_id == run_id

  loop.run(_config(steps=3), str(workdir))  # resumes RL at step 2
  assert {path.name.split("-")[-1] for path in _runs(workdir)} == {run_id}


def test_a_project_without_wandb_installed_is_refused_naming_the_extra(monkeypatch):
  config = _config(steps=1)
  monkeypatch.setattr(refusals.importlib.util, "find_spec",
                      lambda name: None if name == "wandb" else object())
  with pytest.raises(ValueError, match=r"wandb.project is 'jaxcredit-test', but wandb is not "
                                       r"installed: pip install 'jaxcredit\[wandb\]'"):
    refusals.validate_config(config)
  config.wandb.project, config.wandb.mode = "p", "sometimes"
  monkeypatch.undo()
  with pytest.raises(ValueError, match="wandb.mode must be 'online' or 'offline', got 'sometimes'"):
    refusals.validate_config(config)
