"""Chat templates rendered as `transformers` renders them (`pip install jaxcredit[hf]`).

A checkpoint's chat template is a Jinja program over `messages` (a list of
{"role", "content", ...} dicts), `add_generation_prompt`, `tools`,
`documents`, the tokenizer's special tokens (`bos_token`, `eos_token`, ...)
and any extra variables. transformers renders it in a sandboxed Jinja
environment with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, a `{% generation %}` block tag, `raise_exception(message)`,
`strftime_now(format)`, a `tojson` that does not escape HTML, and `dict` /
`namespace` constructors; this module builds the same environment, and the
tests compare its output with `transformers.AutoTokenizer.apply_chat_template`.

  text = render(template, messages, add_generation_prompt=True, bos_token="<s>")
"""

import datetime
import functools
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any


def _environment():
  import jinja2  # optional dependency
  from jinja2 import ext, nodes
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  class Generation(ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text; it renders its body."""

    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  def strftime_now(format):
    return datetime.datetime.now().strftime(format)

  class TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)`, nothing else of the type."""

    def __call__(self, *args, **kwargs):
      return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
      return dict.fromkeys(*args, **kwargs)

  class Namespace(jinja2.utils.Namespace):
    """`namespace(...)` without underscore-prefixed attributes (no way to CPython internals)."""

    def __init__(*args, **kwargs):
      self, attributes = args[0], dict(*args[1:], **kwargs)
      for name in attributes:
        Namespace._check(name)
      jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name, value):
      Namespace._check(name)
      jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
      if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"Chat templates cannot set underscore-prefixed attributes, got {name!r}.")

  environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=[Generation, ext.loopcontrols])
  environment.filters["tojson"] = tojson
  environment.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                             dict=TemplateDict(), namespace=Namespace)
  return environment


@functools.lru_cache(maxsize=16)
def _compiled(template: str):
  return _environment().from_string(template)


def render(template: str, messages: Sequence[Mapping[str, Any]], *,
           add_generation_prompt: bool = False, tools: Sequence[Mapping] | None = None,
           documents: Sequence[Mapping] | None = None, **variables) -> str:
  """The template's text for one conversation.

  Message fields that are None are dropped (as transformers does).

  Args:
    template: the Jinja chat template.
    messages: ``[{"role", "content", ...}]``, non-empty.
    add_generation_prompt: end with the assistant turn's header.
    tools: tool descriptions the template may render.
    documents: documents the template may render.
    **variables: visible to the template by name (the tokenizer's special tokens, and e.g.
      `enable_thinking`).

  Returns:
    the rendered text.

  Raises:
    ValueError: for an empty conversation or a malformed message.
    jinja2.TemplateError: with its message when the template calls `raise_exception`.
  """
  if not messages:
    raise ValueError("Cannot apply a chat template to an empty conversation.")
  for message in messages:
    if not isinstance(message, Mapping):
      raise TypeError(f"Chat messages must be dicts with 'role' and 'content', got {message!r}.")
  messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
  return _compiled(template).render(messages=messages, tools=tools, documents=documents,
                                    add_generation_prompt=add_generation_prompt, **variables)


def read_template(directory: str | pathlib.Path, name: str | None = None) -> str | None:
  """The chat template a checkpoint directory ships.

  Looked up where transformers writes it: ``chat_template.jinja``, then
  ``chat_template.json`` (``{"chat_template": ...}``), then ``tokenizer_config.json``'s
  "chat_template": a string, or a list of ``{"name", "template"}`` from which `name` is
  taken.

  Args:
    directory: a checkpoint or tokenizer directory.
    name: the named template; None for "default".

  Returns:
    the template, or None when the directory has none.

  Raises:
    ValueError: for malformed files or a named template that is absent.
  """
  directory = pathlib.Path(directory)
  if (directory / "chat_template.jinja").exists():
    return (directory / "chat_template.jinja").read_text(encoding="utf-8")
  for file in ("chat_template.json", "tokenizer_config.json"):
    path = directory / file
    if path.exists():
      try:
        template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
      except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
        raise ValueError(f"{path}: not a JSON object ({error}).") from None
      if template is not None:
        return _named(template, name, path)
  return None


def _named(template, name: str | None, path: pathlib.Path) -> str:
  if isinstance(template, str):
    return template
  if not isinstance(template, list) or not all(isinstance(t, dict) for t in template):
    raise ValueError(f"{path}: chat_template must be a string or a list of "
                     f"{{'name', 'template'}}, got {type(template).__name__}.")
  named = {t.get("name"): t.get("template") for t in template}
  key = name or "default"
  if key not in named:
    raise ValueError(f"{path}: no chat template named {key!r}; it has {sorted(map(str, named))}.")
  return named[key]
