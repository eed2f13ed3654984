"""HFTokenizer and its chat templates against transformers.AutoTokenizer itself.

The tokenizers are trained offline with `tokenizers` (byte-level BPE, a
Qwen-style and a Llama-3-style set of special tokens and post-processor),
saved by transformers, and read back by both libraries. The templates are
written here to use every feature of transformers' Jinja environment that
real checkpoints' templates use (trim/lstrip blocks, namespace, loop
controls, raise_exception, strftime_now, tojson, reversed loops, string
methods, {% generation %}).
"""

import json

import jinja2
import pytest
import transformers

from jaxcredit.tasks import HFTokenizer, chat_template
from tests.hf_tokenizers import CORPUS, QWEN_SPECIALS, QWEN_STYLE, trained

LLAMA_STYLE = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- endif %}
{%- set ns = namespace(system="", count=0) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- ns.system }}{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception("Conversation roles must be user or assistant, got " + message['role']) }}
    {%- endif %}
    {%- set ns.count = ns.count + 1 %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
    {%- if ns.count > 6 %}{% break %}{% endif %}
{%- endfor %}
{% if add_generation_prompt %}
    {% if true %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}
{% endif %}
"""

THINKING_STYLE = """{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == "user" and ns.last_query == messages|length - 1 %}
        {%- set ns.last_query = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
        {%- if loop.index0 > ns.last_query and reasoning %}
            {{- '<think>\\n' + reasoning.strip() + '\\n</think>\\n\\n' }}
        {%- endif %}
        {{- content }}
        {%- endgeneration %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]


STYLES = {
    "qwen": (QWEN_SPECIALS, None, dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
             {"default": QWEN_STYLE, "thinking": THINKING_STYLE}),
    "llama": (LLAMA_SPECIALS, "<|begin_of_text|>",
              dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"), {"default": LLAMA_STYLE}),
}


@pytest.fixture(scope="module", params=[("qwen", "default"), ("qwen", "thinking"), ("llama", "default")],
                ids=lambda p: "-".join(p))
def pair(request, tmp_path_factory):
  """(jaxcredit HFTokenizer, transformers AutoTokenizer) of one saved tokenizer directory."""
  style, template = request.param
  specials, bos, tokens, templates = STYLES[style]
  directory = tmp_path_factory.mktemp(f"{style}-{template}")
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=trained(specials, bos),
                                              chat_template=templates[template], **tokens)
  fast.save_pretrained(directory)
  return HFTokenizer(directory), transformers.AutoTokenizer.from_pretrained(directory), template


CONVERSATIONS = [
    [{"role": "user", "content": "Natalia sold 48 clips. How many?"}],
    [{"role": "system", "content": "  Be brief.  "},
     {"role": "user", "content": "What is 12 + 30?"},
     {"role": "assistant", "content": "<think>\nadd\n</think>\n\n42"},
     {"role": "user", "content": "Ünïcödé 🙂 and <|im_end|> inside text?", "name": None}],
    [{"role": "user", "content": f"turn {i}"} if i % 2 == 0 else
     {"role": "assistant", "content": f"<think>r{i}</think>answer {i}"} for i in range(9)],
]


@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_chat_template_text_and_ids_equal_transformers(pair, conversation, add_generation_prompt):
  ours, theirs, _ = pair
  messages = CONVERSATIONS[conversation]
  for variables in ({}, {"enable_thinking": False}, {"date_string": "23 Nov 2026"}):
    kwargs = dict(add_generation_prompt=add_generation_prompt, **variables)
    text = theirs.apply_chat_template(messages, tokenize=False, **kwargs)
    assert ours.apply_chat_template(messages, tokenize=False, **kwargs) == text
    ids = theirs.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    assert ours.apply_chat_template(messages, **kwargs) == list(ids)
    assert len(set(ids)) > 5


def test_tools_are_rendered_with_transformers_tojson(pair):
  ours, theirs, template = pair
  if template != "default":
    pytest.skip("only the tool-using templates render tools")
  tools = [{"type": "function", "function": {"name": "calc", "description": "évalue <b>x</b>",
                                             "parameters": {"type": "object"}}}]
  messages = [{"role": "user", "content": "2+2?"},
              {"role": "assistant", "content": "",
               "tool_calls": [{"name": "calc", "arguments": {"x": "2+2"}}]}]
  for kwargs in (dict(tools=tools), {}):
    if "llama" in ours.special_tokens.get("bos_token", ""):
      messages = messages[:1]
    assert (ours.apply_chat_template(messages, tokenize=False, **kwargs)
            == theirs.apply_chat_template(messages, tokenize=False, **kwargs))


def test_encode_and_decode_equal_transformers(pair):
  ours, theirs, _ = pair
  texts = [*CORPUS[:6], "", " leading space", "trailing  \n\n", "<|im_start|>user\nhi<|im_end|>",
           "<|begin_of_text|>x<|eot_id|>", "a" * 300, "数学🙂" * 7]
  for text in texts:
    ids = theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text) == ids
    for skip in (True, False):
      assert ours.decode(ids, skip_special=skip) == theirs.decode(ids, skip_special_tokens=skip)
  # transformers' default encode adds what the post-processor adds (Llama 3: BOS).
  with_specials = theirs.encode("hi")
  bos = [ours.bos_id] if ours.bos_id is not None and with_specials[0] == ours.bos_id else []
  assert ours.encode("hi", add_bos=bool(bos)) == with_specials
  for name in ("bos", "eos", "pad"):
    assert getattr(ours, f"{name}_id") == getattr(theirs, f"{name}_token_id") or (
        name == "pad" and theirs.pad_token_id is None and ours.pad_id == ours.eos_id)


def test_raise_exception_reaches_the_caller(pair):
  ours, theirs, template = pair
  if "<|begin_of_text|>" not in ours.special_tokens.values():
    pytest.skip("only the Llama-style template validates roles")
  bad = [{"role": "tool", "content": "5"}]
  with pytest.raises(jinja2.TemplateError, match="roles must be user or assistant") as expected:
    theirs.apply_chat_template(bad, tokenize=False)
  with pytest.raises(jinja2.TemplateError, match=str(expected.value)):
    ours.apply_chat_template(bad, tokenize=False)


def test_template_sources(tmp_path):
  """chat_template.jinja first, then tokenizer_config.json's string or named list."""
  assert chat_template.read_template(tmp_path) is None
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]}))
  assert chat_template.read_template(tmp_path) == "A"
  assert chat_template.read_template(tmp_path, "tool_use") == "B"
  with pytest.raises(ValueError, match="no chat template named 'rag'"):
    chat_template.read_template(tmp_path, "rag")
  (tmp_path / "chat_template.jinja").write_text("C")
  assert chat_template.read_template(tmp_path) == "C"
  (tmp_path / "chat_template.jinja").unlink()
  (tmp_path / "tokenizer_config.json").write_text('{"chat_template": 3}')
  with pytest.raises(ValueError, match="must be a string or a list"):
    chat_template.read_template(tmp_path)
  (tmp_path / "tokenizer_config.json").write_text("{not json")
  with pytest.raises(ValueError, match="tokenizer_config.json"):
    chat_template.read_template(tmp_path)


def test_sandbox_refuses_what_transformers_refuses():
  with pytest.raises(jinja2.exceptions.SecurityError):
    chat_template.render("{% set ns = namespace() %}{% set ns._x = 1 %}", [{"role": "user"}])
  with pytest.raises(jinja2.exceptions.SecurityError):
    chat_template.render("{{ messages.__class__.__mro__ }}", [{"role": "user"}])
  with pytest.raises(ValueError, match="empty conversation"):
    chat_template.render("x", [])


def test_missing_template_is_named(tmp_path):
  trained(QWEN_SPECIALS, None).save(str(tmp_path / "tokenizer.json"))
  tokenizer = HFTokenizer(tmp_path, eos_token="<|im_end|>")
  with pytest.raises(ValueError, match="no chat template"):
    tokenizer.apply_chat_template([{"role": "user", "content": "x"}])
  assert HFTokenizer(tmp_path, chat_template="{{ messages[0].content }}").apply_chat_template(
      [{"role": "user", "content": "hi"}], tokenize=False) == "hi"
