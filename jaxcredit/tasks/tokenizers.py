"""Tokenizers with one interface: a character-level one for procedural tasks and
a wrapper over a Hugging Face `tokenizer.json` (the `tokenizers` package,
`pip install jaxcredit[hf]`).

  tokenizer.encode(text, add_bos=False, add_eos=False) -> list[int]
  tokenizer.decode(ids, skip_special=True) -> str
  tokenizer.token_texts(ids) -> list[str]   # each token alone, readable (specials by name)
  tokenizer.encode_batch(texts, length=L, padding="left") -> (ids [B, L] int32, valid [B, L] bool)
"""

import abc
import functools
import json
import pathlib
from collections.abc import Sequence

import numpy as np

from jaxcredit.tasks import chat_template as chat_templates

TRUNCATION = ("error", "left", "right")


class Tokenizer(abc.ABC):
  """The interface of a task's tokenizer: encode / decode one text, encode_batch many.

  Attributes:
    pad_id: the padding id.
    bos_id: the beginning-of-sequence id, or None.
    eos_id: the end-of-sequence id, or None.
  """

  pad_id: int
  bos_id: int | None
  eos_id: int | None

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of token ids."""

  @abc.abstractmethod
  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Token ids of `text`, optionally framed by bos / eos."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
    """The text of `ids`."""

  def token_texts(self, ids: Sequence[int]) -> list[str]:
    """Each token of `ids` on its own as readable text, special tokens by name; an id the
    vocabulary lacks (a model's padded embedding rows) as `unknown_token_text(id)`."""
    return [self.decode([i], skip_special=False) if 0 <= i < self.vocab_size
            else unknown_token_text(i) for i in map(int, ids)]

  def encode_batch(
      self,
      texts: Sequence[str],
      *,
      length: int,
      padding: str = "left",
      truncation: str = "error",
      add_bos: bool = False,
      add_eos: bool = False,
  ) -> tuple[np.ndarray, np.ndarray]:
    """Encodes texts into [B, length] ids and a validity mask.

    padding: "left" (prompts, so generation continues at the right edge) or
    "right". A text longer than `length` raises (truncation="error") or keeps
    its last ("left": drops the start) or first ("right") `length` tokens.
    """
    if padding not in ("left", "right"):
      raise ValueError(f"Unknown padding {padding!r}; known: left, right.")
    if truncation not in TRUNCATION:
      raise ValueError(f"Unknown truncation {truncation!r}; known: {', '.join(TRUNCATION)}.")
    ids = np.full((len(texts), length), self.pad_id, np.int32)
    valid = np.zeros((len(texts), length), bool)
    for row, text in enumerate(texts):
      tokens = self.encode(text, add_bos=add_bos, add_eos=add_eos)
      if len(tokens) > length:
        if truncation == "error":
          raise ValueError(
              f"Text {row} has {len(tokens)} tokens, more than length={length}: {text[:60]!r}.")
        tokens = tokens[-length:] if truncation == "left" else tokens[:length]
      span = slice(length - len(tokens), length) if padding == "left" else slice(0, len(tokens))
      ids[row, span] = tokens
      valid[row, span] = True
    return ids, valid


class CharTokenizer(Tokenizer):
  """One id per character of an alphabet, after the specials pad=0, bos=1, eos=2.

  Args:
    alphabet: the characters, none repeated.

  Raises:
    ValueError: when the alphabet repeats a character.

  Examples:
    >>> from jaxcredit.tasks.tokenizers import CharTokenizer
    >>> tokenizer = CharTokenizer("0123456789+=")
    >>> ids = tokenizer.encode("12+3=", add_eos=True)
    >>> ids, tokenizer.decode(ids)
    ([4, 5, 13, 6, 14, 2], '12+3=')
  """

  pad_id, bos_id, eos_id = 0, 1, 2
  SPECIALS = ("<pad>", "<bos>", "<eos>")

  def __init__(self, alphabet: str):
    if len(set(alphabet)) != len(alphabet):
      raise ValueError(f"Alphabet {alphabet!r} repeats characters.")
    self.alphabet = alphabet
    self._ids = {c: i + len(self.SPECIALS) for i, c in enumerate(alphabet)}

  @property
  def vocab_size(self) -> int:
    return len(self.SPECIALS) + len(self.alphabet)

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    unknown = sorted(set(text) - set(self._ids))
    if unknown:
      raise ValueError(f"Characters {unknown} are not in the alphabet {self.alphabet!r}.")
    ids = [self._ids[c] for c in text]
    return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

  def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
    out = []
    for i in map(int, ids):
      if i < len(self.SPECIALS):
        if not skip_special:
          out.append(self.SPECIALS[i])
      elif i < self.vocab_size:
        out.append(self.alphabet[i - len(self.SPECIALS)])
      else:
        raise ValueError(f"Token id {i} is outside the vocabulary of size {self.vocab_size}.")
    return "".join(out)


def _byte_of_unicode() -> dict[str, int]:
  """GPT-2's byte-level alphabet inverted: the printable character standing for each byte."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
               *range(ord("\u00ae"), ord("\u00ff") + 1)]
  shifted = [b for b in range(256) if b not in printable]
  return {**{chr(b): b for b in printable},
          **{chr(256 + n): b for n, b in enumerate(shifted)}}


_BYTE_OF_UNICODE = _byte_of_unicode()


def unknown_token_text(token_id: int) -> str:
  """How exports and the viewer show an id outside a tokenizer's vocabulary.

  Args:
    token_id: the id.

  Returns:
    e.g. ``<id 430?>``.
  """
  return f"<id {token_id}?>"


class HFTokenizer(Tokenizer):
  """A Hugging Face tokenizer directory (or one ``tokenizer.json``), as transformers reads it.

  From a checkpoint directory, the special tokens (bos / eos / pad / unk ...) and the chat
  template come from its ``tokenizer_config.json`` (and ``chat_template.jinja``), as
  `transformers.AutoTokenizer` takes them; the keyword arguments override them. pad_token
  defaults to eos_token when the tokenizer has no pad token. `encode` adds no special tokens
  of its own (a BOS is asked for with add_bos), like ``encode(text,
  add_special_tokens=False)``.

  Args:
    path: a directory holding tokenizer.json, or the file itself.
    bos_token: overrides the configured BOS.
    eos_token: overrides the configured EOS.
    pad_token: overrides the configured pad token.
    chat_template: overrides the directory's chat template.

  Raises:
    ValueError: without tokenizer.json, or for a special token the vocabulary lacks.
  """

  SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                    "mask_token")

  def __init__(self, path: str | pathlib.Path, *, bos_token: str | None = None,
               eos_token: str | None = None, pad_token: str | None = None,
               chat_template: str | None = None):
    from tokenizers import Tokenizer  # optional dependency

    path = pathlib.Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
      raise ValueError(f"No tokenizer.json at {path}.")
    self._tokenizer = Tokenizer.from_file(str(file))
    given = {"bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token}
    self.special_tokens = {
        **(_configured_special_tokens(path) if path.is_dir() else {}),
        **{name: token for name, token in given.items() if token is not None}}
    for token in self.special_tokens.values():
      self._special_id(token)
    self.bos_id = self._special_id(self.special_tokens.get("bos_token"))
    self.eos_id = self._special_id(self.special_tokens.get("eos_token"))
    pad_id = self._special_id(self.special_tokens.get("pad_token"))
    self.pad_id = pad_id if pad_id is not None else (self.eos_id if self.eos_id is not None else 0)
    self.chat_template = (chat_template if chat_template is not None
                          else chat_templates.read_template(path) if path.is_dir() else None)

  def _special_id(self, token: str | None) -> int | None:
    if token is None:
      return None
    token_id = self._tokenizer.token_to_id(token)
    if token_id is None:
      raise ValueError(f"Special token {token!r} is not in the tokenizer's vocabulary.")
    return token_id

  @property
  def vocab_size(self) -> int:
    return self._tokenizer.get_vocab_size()

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    for flag, token_id, name in ((add_bos, self.bos_id, "bos"), (add_eos, self.eos_id, "eos")):
      if flag and token_id is None:
        raise ValueError(f"add_{name}=True but no {name}_token was given.")
    ids = self._tokenizer.encode(text, add_special_tokens=False).ids
    return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

  def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special)

  def token_texts(self, ids: Sequence[int]) -> list[str]:
    """Each token on its own. With a byte-level decoder (GPT-2, Qwen, Llama 3), a piece is its
    bytes decoded as UTF-8, the bytes of a character split across tokens as \\xNN escapes
    (never U+FFFD); special tokens and other vocabularies as `decode` gives them; an id the
    vocabulary lacks as `unknown_token_text(id)`."""
    specials = {i for i, token in self._tokenizer.get_added_tokens_decoder().items()
                if token.special}
    texts = []
    for i in map(int, ids):
      piece = self._tokenizer.id_to_token(i) if i >= 0 else None
      if piece is None:
        texts.append(unknown_token_text(i))
      elif self._byte_level and i not in specials:
        texts.append(bytes(map(_BYTE_OF_UNICODE.__getitem__, piece)).decode(
            "utf-8", "backslashreplace"))
      else:
        texts.append(self._tokenizer.decode([i], skip_special_tokens=False))
    return texts

  @functools.cached_property
  def _byte_level(self) -> bool:
    """Whether the tokenizer decodes with GPT-2's byte-level alphabet."""
    decoder = json.loads(self._tokenizer.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return any(part.get("type") == "ByteLevel" for part in parts)

  def apply_chat_template(self, messages: Sequence[dict], *, add_generation_prompt: bool = False,
                          tokenize: bool = True, **variables) -> list[int] | str:
    """The chat template's rendering of `messages` ([{"role", "content"}, ...]):
    its token ids, or its text with tokenize=False. The special tokens and
    `variables` (e.g. tools=..., enable_thinking=False) are visible to the
    template; the ids are `encode(text)` (the template writes its own specials)."""
    if self.chat_template is None:
      raise ValueError("This tokenizer has no chat template: its directory has no "
                       "chat_template.jinja and its tokenizer_config.json no chat_template; "
                       "pass chat_template=... to HFTokenizer.")
    text = chat_templates.render(self.chat_template, messages,
                                 add_generation_prompt=add_generation_prompt,
                                 **{**self.special_tokens, **variables})
    return self.encode(text) if tokenize else text


def _configured_special_tokens(directory: pathlib.Path) -> dict[str, str]:
  """{"bos_token": "<s>", ...} from tokenizer_config.json (or the older
  special_tokens_map.json); a token may be stored as {"content": ...}."""
  tokens = {}
  for file in ("special_tokens_map.json", "tokenizer_config.json"):
    path = directory / file
    if not path.exists():
      continue
    try:
      config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
      raise ValueError(f"{path}: not valid JSON ({error}).") from None
    for name in HFTokenizer.SPECIAL_TOKENS:
      token = config.get(name)
      token = token.get("content") if isinstance(token, dict) else token
      if token is not None:
        if not isinstance(token, str):
          raise ValueError(f"{path}: {name} must be a string, got {token!r}.")
        tokens[name] = token
  return tokens
