"""Tokenizers with one interface: a character-level one for procedural tasks and
a wrapper over a Hugging Face `tokenizer.json` (the `tokenizers` package,
`pip install jaxcredit[hf]`).

  tokenizer.encode(text, add_bos=False, add_eos=False) -> list[int]
  tokenizer.decode(ids, skip_special=True) -> str
  tokenizer.encode_batch(texts, length=L, padding="left") -> (ids [B, L] int32, valid [B, L] bool)
"""

import abc
import pathlib
from collections.abc import Sequence

import numpy as np

TRUNCATION = ("error", "left", "right")


class Tokenizer(abc.ABC):
  """The interface: encode / decode one text, encode_batch many; pad/bos/eos ids."""

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
  """One id per character of `alphabet`, after the specials pad=0, bos=1, eos=2."""

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


class HFTokenizer(Tokenizer):
  """A Hugging Face `tokenizer.json`, with named special tokens.

  pad_token defaults to eos_token when the tokenizer has no pad token.
  """

  def __init__(self, path: str | pathlib.Path, *, bos_token: str | None = None,
               eos_token: str | None = None, pad_token: str | None = None):
    from tokenizers import Tokenizer  # optional dependency

    path = pathlib.Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
      raise ValueError(f"No tokenizer.json at {path}.")
    self._tokenizer = Tokenizer.from_file(str(file))
    self.bos_id = self._special_id(bos_token)
    self.eos_id = self._special_id(eos_token)
    pad_id = self._special_id(pad_token)
    self.pad_id = pad_id if pad_id is not None else (self.eos_id if self.eos_id is not None else 0)

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
