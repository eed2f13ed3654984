"""calculator: the tool's replies, the episode's rule, and SFT on the policy's turns only."""

import numpy as np
import pytest

from jaxcredit.tasks import CharTokenizer, calculator

TOKENIZER = CharTokenizer(calculator.ALPHABET)
ENV = calculator.CalculatorEnv(TOKENIZER)


def _play(example, turns):
  state, observation = ENV.reset(np.random.default_rng(0), example)
  shown, rewards, done = [TOKENIZER.decode(observation)], [], False
  for turn in turns:
    state, observation, reward, done = ENV.step(state, np.asarray(TOKENIZER.encode(turn)))
    shown.append(TOKENIZER.decode(observation))
    rewards.append(reward)
  return shown, rewards, done


def test_the_demonstration_is_rewarded_through_the_tool():
  example = calculator.make_example(np.random.default_rng(4), calculator.CalculatorConfig())
  expression = example["prompt"][:-1]
  assert int(example["answer"]) == eval(expression)  # the test's own check of the generator
  shown, rewards, done = _play(example, [f"C{expression};", f"A{example['answer']};"])
  assert shown == ["", f"={example['answer']};", ""] and rewards == [0.0, 1.0] and done
  assert _play(example, [f"A{int(example['answer']) + 1};"])[1:] == ([0.0], True)


@pytest.mark.parametrize("turn", ["C1+;", "C;", "C12*;", "E12;", "C12+3", "A12", "=5;", "C+-*;",
                                  "CA1;"])
def test_what_the_tool_cannot_read_is_shown_an_error_and_the_episode_goes_on(turn):
  example = {"prompt": b"2*3=", "answer": b"6", "completion": b""}
  shown, rewards, done = _play(example, [turn])
  assert shown[1:] == ["E;"] and rewards == [0.0] and not done


@pytest.mark.parametrize("expression,value", [("2*3+4", 10), ("2+3*4", 14), ("10-12", -2),
                                              ("007*2", 14)])
def test_the_tool_evaluates_with_precedence(expression, value):
  assert calculator.evaluate(expression) == f"={value};"


def test_demonstration_actions_are_the_policy_turns():
  completion = "C47*38+215;=2001;A2001;"
  actions = calculator.demonstration_actions(completion)
  assert "".join(c for c, a in zip(completion, actions) if a) == "C47*38+215;A2001;"
  assert "".join(c for c, a in zip(completion, actions) if not a) == "=2001;"
  errors = calculator.demonstration_actions("C1+;E;A3;")
  assert "".join(c for c, a in zip("C1+;E;A3;", errors) if a) == "C1+;A3;"


def test_sft_rows_train_on_the_policy_turns_only(tmp_path):
  import ml_collections

  from jaxcredit import tasks
  from jaxcredit.tasks import loader

  config = ml_collections.ConfigDict({"name": "calculator", "options": {}, "train_size": 16,
                                      "test_size": 4, "max_prompt_length": 14,
                                      "max_response_length": 0})
  task = tasks.make(config, data_dir=str(tmp_path), seed=0)
  data = loader.Loader(task.sources["train"], encode=task.encode, batch_size=4,
                       max_prompt_length=task.max_prompt_length, seed=0)
  batch = data.sft_batch(0, length=task.max_prompt_length + task.max_response_length)
  mask = task.sft_loss_mask(batch["tokens"], batch["loss_mask"])
  for row, row_mask in zip(batch["tokens"], mask):
    trained = TOKENIZER.decode(row[row_mask])
    assert trained.startswith("C") and trained.count(";") == 2 and "=" not in trained, trained
  assert task.turn_end_tokens == tuple(TOKENIZER.encode(";"))
