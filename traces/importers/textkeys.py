"""From chat messages to prompt keys: the chat template (jinja2), the tokenizer
(``tokenizers``) and the text block hashes of ``--hash-text``.

Two ways to turn a request's rendered prompt into a trace prompt:

* **tokens** (`Tokenize`): the user's ``tokenizer.json`` encodes the rendered text (no
  special tokens added: the template writes them); the trace gets the real ``token_ids``.
  Exact lengths and exact prefix sharing, but the token ids can be decoded back to text
  with the same tokenizer.
* **text hashes** (`TextBlockHasher`, ``--hash-text``): no tokenizer. The rendered text is
  encoded as UTF-8 and cut into chunks of ``block_size * bytes_per_token`` bytes (the last
  chunk shorter); chunk i gets the digest ``h_i = blake2b(h_{i-1} || chunk_i)`` (h_-1 empty),
  so a digest stands for its chunk and everything before it, and equal digests mean equal
  text prefixes; digests become dense hash ids in first-seen order. The prompt length is
  ``ceil(bytes / bytes_per_token)`` tokens (an approximation: about 4 bytes per token for
  English text with BPE tokenizers), so chunk i is block i of the trace. Two prompts share
  exactly the chunks of their common byte prefix that end inside it (a prefix that ends
  inside a chunk shares nothing of that chunk). Only ids leave the machine, never text.

The chat template is rendered the way Hugging Face's ``apply_chat_template`` does it: a
sandboxed jinja2 environment, ``messages``, ``add_generation_prompt=True``, ``bos_token`` /
``eos_token`` from ``tokenizer_config.json``, ``raise_exception`` and a ``tojson`` filter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traces.schema import TraceParamError

#: How to install what the tokenizer path needs.
INSTALL_HINT = (
    "install it with: pip install 'hicache-sim[import]' (or: pip install tokenizers jinja2)"
)

#: The template used when neither --chat-template nor tokenizer_config.json gives one: each
#: message as ``<|role|>\ncontent\n``, then ``<|assistant|>\n`` (the generation prompt).
PLAIN_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _need(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise TraceParamError(
            f"the OpenAI chat importer needs the {module!r} package: {INSTALL_HINT}"
        ) from None


def _special(value: object) -> str:
    # tokenizer_config.json writes special tokens as a string or {"content": "..."}
    if isinstance(value, dict):
        value = value.get("content", "")
    return value if isinstance(value, str) else ""


def _template_from_config(config: dict[str, Any], where: Path) -> str | None:
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        chosen = named.get("default") or next(iter(named.values()), None)
        if isinstance(chosen, str):
            return chosen
    raise TraceParamError(f"{where}: chat_template is neither a string nor a list of templates")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceParamError(f"cannot read {path}: {exc}") from None
    if not isinstance(obj, dict):
        raise TraceParamError(f"{path}: expected a JSON object")
    return obj


def tokenizer_files(tokenizer: Path) -> tuple[Path, Path | None]:
    """(tokenizer.json, tokenizer_config.json or None) for a tokenizer.json file or a
    directory holding one."""
    file = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
    if not file.is_file():
        raise TraceParamError(f"no tokenizer file {file} (give a tokenizer.json or its folder)")
    config = file.parent / "tokenizer_config.json"
    return file, (config if config.is_file() else None)


def chat_template(
    config_path: Path | None, template_path: Path | None
) -> tuple[str, str, dict[str, str]]:
    """(template source, where it came from, special tokens) for rendering prompts.

    `template_path` (``--chat-template``) wins: a jinja file, or a JSON file with a
    ``chat_template`` key (a tokenizer_config.json). Else the ``chat_template`` of
    `config_path`; else `PLAIN_TEMPLATE` (origin ``"builtin-plain"``)."""
    config = _read_json(config_path) if config_path is not None else {}
    specials = {k: _special(config.get(k)) for k in ("bos_token", "eos_token")}
    if template_path is not None:
        if template_path.suffix.lower() == ".json":
            found = _template_from_config(_read_json(template_path), template_path)
            if found is None:
                raise TraceParamError(f"{template_path}: no chat_template key")
            return found, str(template_path), specials
        try:
            return template_path.read_text(encoding="utf-8"), str(template_path), specials
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceParamError(f"cannot read chat template {template_path}: {exc}") from None
    if config_path is not None:
        found = _template_from_config(config, config_path)
        if found is not None:
            return found, str(config_path), specials
    return PLAIN_TEMPLATE, "builtin-plain", specials


def template_renderer(source: str, specials: dict[str, str]) -> Callable[[list[Any]], str]:
    """A function rendering a message list with the template (add_generation_prompt on).
    Raises `TraceParamError` if the template does not compile; a render error is a
    `ValueError` with jinja's message (the caller names the line)."""
    _need("jinja2")
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    try:
        template = env.from_string(source)
    except TemplateError as exc:
        raise TraceParamError(f"the chat template does not compile: {exc}") from None

    def render(messages: list[Any]) -> str:
        try:
            return template.render(messages=messages, add_generation_prompt=True, **specials)
        except TemplateError as exc:
            raise ValueError(f"chat template: {exc}") from None

    return render


class Tokenize:
    """Encodes rendered prompts with a ``tokenizer.json`` (no special tokens added)."""

    def __init__(self, tokenizer_file: Path) -> None:
        tokenizers = _need("tokenizers")
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the Rust side raises plain Exceptions
            raise TraceParamError(f"cannot load tokenizer {tokenizer_file}: {exc}") from None

    def ids(self, text: str) -> list[int]:
        """The token ids of `text`."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        """The number of tokens of `text`."""
        return len(self.ids(text))


class TextBlockHasher:
    """Block hash ids of text without a tokenizer (see the module docstring for the rule).

    `block_size` is the trace's block size in tokens, `bytes_per_token` the assumed UTF-8
    bytes per token; ids are dense ints from 0 in first-seen order, shared across calls."""

    def __init__(self, block_size: int, bytes_per_token: int = 4) -> None:
        if bytes_per_token < 1:
            raise TraceParamError(f"bytes_per_token must be >= 1, got {bytes_per_token}")
        self.block_size = block_size
        self.bytes_per_token = bytes_per_token
        self.chunk = block_size * bytes_per_token
        self._ids: dict[bytes, int] = {}

    def count(self, text: str) -> int:
        """The approximate number of tokens of `text`: ceil(UTF-8 bytes / bytes_per_token)."""
        return -(-len(text.encode("utf-8")) // self.bytes_per_token)

    def ids(self, text: str) -> tuple[int, list[int]]:
        """(input_length in approximate tokens, one hash id per block)."""
        data = text.encode("utf-8")
        out: list[int] = []
        digest = b""
        for start in range(0, len(data), self.chunk):
            digest = hashlib.blake2b(digest + data[start : start + self.chunk]).digest()
            out.append(self._ids.setdefault(digest, len(self._ids)))
        return -(-len(data) // self.bytes_per_token), out
