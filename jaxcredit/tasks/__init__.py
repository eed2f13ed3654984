"""Tasks with verifiable rewards, their tokenizers and data, each registered by name.

  task = tasks.make(config.task, data_dir=..., seed=0)   # a TrainTask bound to its data
  tasks.names()                                          # every registered task
  tasks.get(name).traceable, tasks.get(name).oracle      # the lab's form, the exact oracle
  tasks.register(tasks.Task(name=..., options=..., data=..., train=...))

Each built-in task is one module (or, with an oracle, one package) that registers itself on
import.
"""

from jaxcredit.tasks import (arithmetic, calculator, chat_template, countdown, gsm8k, key_token,
                             key_turns, log_lookup, target_sum, zipf_explain)
from jaxcredit.tasks.task import (Task, TrainTask, get, make, multi_turn_source, names,
                                  of_options, options_of, register, unregister, within_tokenizer)
from jaxcredit.tasks.tokenizers import CharTokenizer, HFTokenizer, Tokenizer

__all__ = ["CharTokenizer", "HFTokenizer", "Task", "Tokenizer", "TrainTask", "arithmetic",
           "calculator", "chat_template", "countdown", "get", "gsm8k", "key_token", "key_turns",
           "log_lookup", "make", "multi_turn_source", "names", "of_options", "options_of",
           "register", "target_sum", "unregister", "within_tokenizer", "zipf_explain"]
