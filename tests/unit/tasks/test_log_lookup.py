"""log_lookup: the log, the tool's pages, the episode's rule, 100k-token episodes, and episodes
sampled through the KV cache kept across turns."""

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from jaxcredit import tasks
from jaxcredit.models import Transformer, preset
from jaxcredit.tasks import CharTokenizer, log_lookup

TOKENIZER = CharTokenizer(log_lookup.ALPHABET)
CONFIG = log_lookup.LogLookupConfig(n_pages=3, page_records=5)
ENV = log_lookup.LogLookupEnv(CONFIG, TOKENIZER)


def _play(env, example, turns):
  """The observations and rewards of an episode whose turns are `turns` (texts)."""
  state, observation = env.reset(np.random.default_rng(0), example)
  observations, rewards, done = [TOKENIZER.decode(observation)], [], False
  for turn in turns:
    assert not done
    state, observation, reward, done = env.step(state, np.asarray(TOKENIZER.encode(turn)))
    observations.append(TOKENIZER.decode(observation))
    rewards.append(reward)
  return observations, rewards, done


def test_the_key_is_in_one_record_of_the_examples_page():
  for seed in range(20):
    example = log_lookup.make_example(np.random.default_rng(seed), CONFIG)
    keys, values = log_lookup.log(example["seed"], CONFIG)
    assert len(set(keys.tolist())) == len(keys) == 15
    key = int(example["prompt"][1:-1], 16)
    (record,) = np.flatnonzero(keys == key)
    assert record // CONFIG.page_records == example["page"]
    assert example["answer"] == f"{values[record]:02d}"
    page = log_lookup.page_text(example["seed"], example["page"], CONFIG)
    assert f"{key:04x}:{example['answer']};" in page and len(page) == CONFIG.page_length


def test_each_read_shows_the_next_page_then_the_answer_ends_the_episode():
  example = log_lookup.make_example(np.random.default_rng(3), CONFIG)
  pages = [log_lookup.page_text(example["seed"], p, CONFIG) for p in range(3)]
  # Any turn but an answer reads, a cut-off answer (no `;`) too; past the last page, `E;`.
  turns = ["0;", "A1", "?;", "1;", f"A{example['answer']};"]
  observations, rewards, done = _play(ENV, example, turns)
  assert observations == ["", *pages, "E;", ""] and rewards == [0, 0, 0, 0, 1.0] and done
  wrong = f"{(int(example['answer']) + 1) % 100:02d}"
  assert _play(ENV, example, [f"A{wrong};"])[1:] == ([0.0], True)
  # The state a turn starts from is the pages read.
  state, _ = ENV.reset(None, example)
  assert ENV.anchor(state) == 0 and ENV.anchor(ENV.step(state, TOKENIZER.encode("0;"))[0]) == 1


def test_an_episode_that_reads_the_long_log_holds_over_100k_tokens():
  config = log_lookup.LONG
  env = log_lookup.LogLookupEnv(config, TOKENIZER)
  example = log_lookup.make_example(np.random.default_rng(0), config)
  state, _ = env.reset(None, example)
  tokens = 0
  for _ in range(config.n_pages):
    state, observation, _, done = env.step(state, np.asarray(TOKENIZER.encode("0;")))
    tokens += len(observation) + 2
    assert not done and len(observation) == config.page_length == 2_112
  state, observation, reward, done = env.step(state, TOKENIZER.encode(f"A{example['answer']};"))
  tokens += 4
  assert (reward, done) == (1.0, True) and tokens > 100_000
  assert config.episode_length >= tokens


def test_options_out_of_range_are_refused():
  with pytest.raises(ValueError, match="n_pages \\* page_records must be at most 65536"):
    log_lookup.LogLookupConfig(n_pages=300, page_records=300)
  with pytest.raises(ValueError, match="max_turn_tokens must be >= 4"):
    log_lookup.LogLookupConfig(max_turn_tokens=3)


def test_sampled_episodes_lay_out_the_pages_the_tool_returned(tmp_path):
  """Through `tasks.multi_turn_source` and the cache kept across turns (its headroom capped by
  the model's max_position): each row is the prompt, then turns (trained, mask 1) and the pages
  the tool returned for them (mask 0), in order."""
  config = ml_collections.ConfigDict({
      "name": "log_lookup", "options": {"n_pages": 3, "page_records": 20}, "train_size": 4,
      "test_size": 4, "max_prompt_length": 8, "max_response_length": 0})
  task = tasks.make(config, data_dir=str(tmp_path), seed=0)
  examples = [task.sources["test"][i] for i in range(4)]
  prompts = np.stack([np.pad(task.encode(e)[0], (8 - len(task.encode(e)[0]), 0)) for e in examples])
  source = tasks.multi_turn_source(task, group_size=1, temperature=1.0)
  # Rows of exactly prompt + episode + a turn: the cache's headroom stops at max_position.
  most = 8 + task.max_response_length + task.max_turn_tokens
  model = Transformer(preset("tiny", vocab_size=task.vocab_size, max_position=most),
                      rngs=nnx.Rngs(0))
  rollout = source(model, {"prompts": prompts, "prompt_valid": prompts > 0, "examples": examples},
                   jax.random.key(0))
  tokens, mask = np.asarray(rollout.tokens)[:, 8:], np.asarray(rollout.mask)[:, 8:]
  valid = np.asarray(rollout.token_valid)[:, 8:]
  for row, example in enumerate(examples):
    observed = TOKENIZER.decode(tokens[row][valid[row] & ~mask[row]])
    pages = "".join(log_lookup.page_text(int(example["seed"]), p, task.config) for p in range(3))
    assert observed == (pages + "E;")[:len(observed)]  # the pages in order, as far as it read
  assert (valid & ~mask).sum() >= 160  # at least one page was read
