"""Byte-level BPE tokenizers trained offline with `tokenizers`, saved as transformers saves
them: the stand-ins for a checkpoint's tokenizer in the tests."""

import pathlib

import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
  "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
  "How many clips did Natalia sell altogether in April and May? #### 72",
  "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
  "def add(a, b):\n    return a + b\n\n",
  "Ünïcödé — ✓ 数学 🙂 tabs\tand  spaces",
  "<think>\nok\n</think>",
] * 20

QWEN_STYLE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}
    {{- "# Tools\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}{{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a careful solver of word problems.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "system" %}{% continue %}{% endif %}
    {%- if message.role == "assistant" and message.tool_calls is defined %}
        {{- '<|im_start|>assistant' }}
        {%- for call in message.tool_calls %}
            {{- '\\n<tool_call>\\n' }}{{- call | tojson(indent=2) }}{{- '\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def trained(specials: list[str], bos: str | None) -> Tokenizer:
  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=600,
    special_tokens=specials,
    show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  tokenizer.train_from_iterator(CORPUS, trainer)
  if bos is not None:  # Llama 3 prepends BOS in its post-processor
    tokenizer.post_processor = processors.TemplateProcessing(
      single=f"{bos} $A",
      pair=f"{bos} $A {bos} $B",
      special_tokens=[(bos, tokenizer.token_to_id(bos))],
    )
  return tokenizer


def save_qwen_style(directory: pathlib.Path) -> pathlib.Path:
  """A Qwen-style tokenizer directory (eos <|im_end|>, pad <|endoftext|>, QWEN_STYLE template)."""
  fast = transformers.PreTrainedTokenizerFast(
    tokenizer_object=trained(QWEN_SPECIALS, None),
    chat_template=QWEN_STYLE,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
  )
  fast.save_pretrained(directory)
  return directory
