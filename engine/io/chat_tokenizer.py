"""The tokenizer interface the engine uses, over a `tokenizers.Tokenizer`, with the chat template rendered by
jinja2 the way transformers renders it.

For GGUF models this replaces transformers' PreTrainedTokenizerFast: importing transformers and building that
wrapper around a 150k-token vocabulary cost about 1.5 s of every load, for a handful of methods.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from typing import Any


class TemplateError(ValueError):
    """A chat template raised (raise_exception) or could not be rendered."""


class ChatTokenizer:
    def __init__(self, tokenizer: Any, *, bos_token: str | None, eos_token: str | None, pad_token: str | None = None,
                 unk_token: str | None = None, chat_template: str | None = None) -> None:
        self.tk = tokenizer  # tokenizers.Tokenizer
        self.bos_token, self.eos_token, self.pad_token, self.unk_token = bos_token, eos_token, pad_token, unk_token
        self.chat_template = chat_template

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.tk.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    def __len__(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.tk.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tk.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        # No clean-up pass: byte-level BPE text is exact as decoded (transformers' is off for these files too).
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tk.token_to_id(token)

    @cached_property
    def _template(self) -> Any:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        # The conventions of Hugging Face chat templates: trimmed blocks, loop controls, a non-ASCII-escaping
        # tojson, raise_exception and strftime_now.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.chat_template)
        except jinja2.TemplateError as e:
            raise TemplateError(f"the model's chat template does not parse: {e}") from e

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = True,
                            add_generation_prompt: bool = False, **kwargs: Any) -> list[int] | str:
        """The conversation as the template renders it; token ids (no added specials) unless tokenize=False."""
        if not self.chat_template:
            raise TemplateError("this tokenizer has no chat template")
        specials = dict(bos_token=self.bos_token, eos_token=self.eos_token, pad_token=self.pad_token,
                        unk_token=self.unk_token)
        text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, tools=None,
                                     documents=None, **specials, **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text
