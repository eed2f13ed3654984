"""tests/compile_profile.py: its recorder counts what jax.monitoring reports of a compile, and
its table sums the records by file."""

import json

import jax
import jax.numpy as jnp
import pytest

from tests import compile_profile


def test_the_recorder_counts_a_new_program_and_not_a_compiled_one():
  f, x = jax.jit(lambda x: jnp.sin(x) * 3.0 + jnp.cos(x)), jnp.ones(17)
  recorder = compile_profile.Recorder()
  recorder.start()
  try:
    f(x).block_until_ready()  # a function of this test's own: a new program
    new = recorder.record("t", 1.0)
    recorder.reset()
    f(x).block_until_ready()
    again = recorder.record("t", 1.0)
  finally:
    recorder.stop()
  assert new["programs"] == 1 and new["compile"] > 0 and new["lower"] > 0 and new["trace"] > 0
  assert again["programs"] == 0 and again["compile"] == again["lower"] == again["trace"] == 0
  jax.jit(lambda x: x - 1.0)(x)  # after stop: not counted
  assert recorder.programs == 0


def test_the_table_sums_each_file_and_orders_the_files_by_seconds(tmp_path):
  records = [
      {"test": "a.py::x", "seconds": 2.0, "trace": 0.1, "lower": 0.2, "compile": 0.5,
       "programs": 3, "cache_hits": 1},
      {"test": "a.py::y", "seconds": 1.0, "trace": 0.0, "lower": 0.1, "compile": 0.2,
       "programs": 1, "cache_hits": 0},
      {"test": "b.py::z", "seconds": 5.0, "trace": 1.0, "lower": 1.0, "compile": 1.0,
       "programs": 2, "cache_hits": 2},
  ]
  (tmp_path / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
  (tmp_path / "2.jsonl").write_text(json.dumps(records[2]) + "\n")
  assert sorted(compile_profile.read(tmp_path), key=str) == sorted(records, key=str)
  files = compile_profile.by_file(records)
  assert files["a.py"]["seconds"] == 3.0 and files["a.py"]["programs"] == 4
  assert files["a.py"]["compile"] == pytest.approx(0.7)
  lines = compile_profile.table(records).splitlines()
  assert lines[1].split() == ["8.0", "1.1", "1.3", "1.7", "3.9", "6", "3", "(all)"]
  assert lines[2].split() == ["5.0", "1.0", "1.0", "1.0", "2.0", "2", "2", "b.py"]
  assert lines[3].split() == ["3.0", "0.1", "0.3", "0.7", "1.9", "4", "1", "a.py"]

