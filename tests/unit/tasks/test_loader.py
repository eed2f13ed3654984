"""The loader: group layout, determinism, resume equivalence, disjoint process shards."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxcredit.tasks import CharTokenizer, arithmetic, key_token, loader
from tests.conftest import doc_block

TOKENIZER = CharTokenizer(arithmetic.ALPHABET)


def _source(n=23, seed=0):
  rng = np.random.default_rng(seed)
  return [
    arithmetic.make_example(rng, arithmetic.ArithmeticConfig(min_digits=1, max_digits=4))
    for _ in range(n)
  ]


def _loader(source, **kw):
  args = dict(encode=loader.text_encoder(TOKENIZER), batch_size=4, max_prompt_length=12, seed=7)
  return loader.Loader(source, **{**args, **kw})


def test_rl_batch_layout():
  source = _source()
  batch = _loader(source).rl_batch(0, group_size=3)
  assert batch["prompts"].shape == (12, 12)
  for g in range(4):
    rows = batch["prompts"][3 * g : 3 * g + 3]
    assert (rows == rows[0]).all()
    example = batch["examples"][3 * g]
    text = TOKENIZER.decode(rows[0][batch["prompt_valid"][3 * g]])
    assert text == example["prompt"]
  assert batch["prompt_valid"][:, -1].all()  # left-padded


def test_every_prompt_holds_each_kept_example_once_in_source_order():
  source = _source(40)
  data = _loader(source, max_prompt_length=8)  # 1-4 digit operands: some prompts do not fit
  batch = data.every_prompt()
  kept = [e for e in source if len(TOKENIZER.encode(e["prompt"], add_bos=True)) <= 8]
  assert 0 < data.dropped == len(source) - len(kept)
  assert batch["examples"] == kept and batch["prompts"].shape == (len(kept), 8)
  for row, example in enumerate(kept):
    assert TOKENIZER.decode(batch["prompts"][row][batch["prompt_valid"][row]]) == example["prompt"]


def test_sft_batch_layout():
  source = _source()
  batch = _loader(source).sft_batch(2, length=20)
  for row in range(4):
    completion = TOKENIZER.decode(batch["tokens"][row][batch["loss_mask"][row]])
    prompt = TOKENIZER.decode(batch["tokens"][row, :12][batch["token_valid"][row, :12]])
    assert completion and prompt.endswith("=")
    assert batch["tokens"][row][batch["loss_mask"][row]][-1] == TOKENIZER.eos_id
  assert not (batch["loss_mask"] & ~batch["token_valid"]).any()


@given(steps=st.integers(1, 30), resume=st.integers(0, 29))
def test_resume_gives_the_same_stream(steps, resume):
  source = _source(11)
  resume = min(resume, steps)
  full = [tuple(_loader(source).example_indices(s)) for s in range(steps)]
  restarted = [tuple(_loader(source).example_indices(s)) for s in range(resume, steps)]
  assert full[resume:] == restarted
  flat = np.concatenate([np.asarray(f) for f in full])
  for epoch_start in range(0, len(flat) - 10, 11):  # every epoch is a permutation
    assert sorted(flat[epoch_start : epoch_start + 11]) == list(range(11))


def test_process_shards_are_disjoint_and_cover_the_global_batch():
  source = _source(40)
  whole = _loader(source, batch_size=8)
  for step in range(6):
    shards = [
      _loader(source, batch_size=8, process_index=p, process_count=4).example_indices(step)
      for p in range(4)
    ]
    np.testing.assert_array_equal(np.concatenate(shards), whole.example_indices(step))
  with pytest.raises(ValueError, match="batch_size 8 is not divisible by process_count 3"):
    _loader(source, batch_size=8, process_count=3)


def test_overlong_prompts_are_counted():
  source = _source(30, seed=1)
  lengths = [len(TOKENIZER.encode(e["prompt"], add_bos=True)) for e in source]
  dropping = _loader(source, max_prompt_length=8)
  assert dropping.dropped == sum(n > 8 for n in lengths) > 0
  used = {int(i) for s in range(20) for i in dropping.example_indices(s)}
  assert all(lengths[i] <= 8 for i in used)
  truncating = _loader(source, max_prompt_length=8, overlong="truncate")
  batch = truncating.rl_batch(0, group_size=2)
  want = sum(lengths[int(i)] > 8 for i in truncating.example_indices(0))
  assert batch["truncated"] == want
  with pytest.raises(ValueError, match="Unknown overlong policy 'skip'"):
    _loader(source, overlong="skip")
  with pytest.raises(ValueError, match="No example fits"):
    _loader(source, max_prompt_length=1)


def test_ids_encoder_for_key_token():
  config = key_token.KeyTokenConfig()
  rng = np.random.default_rng(0)
  source = [key_token.make_example(rng, config) for _ in range(5)]
  ids_loader = loader.Loader(source, encode=loader.ids_encoder, batch_size=2, max_prompt_length=4)
  batch = ids_loader.sft_batch(0, length=12)
  chosen = [source[int(i)] for i in ids_loader.example_indices(0)]
  np.testing.assert_array_equal(batch["tokens"][:, :4], np.stack([e["prompt"] for e in chosen]))
  np.testing.assert_array_equal(batch["tokens"][:, 4:], np.stack([e["completion"] for e in chosen]))


def test_readme_tasks_example_runs(tmp_path):
  block = doc_block("loader.Loader(")
  block = block.replace("/tmp/jaxcredit_data", str(tmp_path)).replace(
    "train_size=2000", "train_size=64, test_size=8"
  )
  namespace = {"step": 3}
  exec(
    block.replace(
      "scores, reasons",
      "responses = [e['answer'].decode() for e in batch['examples']]\nscores, reasons",
    ),
    namespace,
  )
  assert namespace["batch"]["prompts"].shape == (256, 10)
  assert namespace["scores"].mean() == 1.0


class _CountingSource(list):
  reads = 0

  def __getitem__(self, index):
    self.reads += 1
    return super().__getitem__(index)


def test_known_prompt_lengths_keep_the_same_examples_without_reading_the_source():
  source = _CountingSource(_source(40))
  scanned = _loader(source, max_prompt_length=8)
  assert source.reads == 40 and 0 < scanned.dropped < 40
  lengths = [len(loader.text_encoder(TOKENIZER)(e)[0]) for e in list.__iter__(source)]
  source.reads = 0
  given_lengths = _loader(source, max_prompt_length=8, prompt_lengths=lengths)
  assert source.reads == 0
  np.testing.assert_array_equal(given_lengths.indices, scanned.indices)
  assert given_lengths.dropped == scanned.dropped
  with pytest.raises(ValueError, match="prompt_lengths has 39 entries for a source of 40"):
    _loader(source, max_prompt_length=8, prompt_lengths=lengths[:-1])
