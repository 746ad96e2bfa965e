"""Prompt tokens counted with the engine's own tokenizer.

This module must never load more than the vocabulary of a model.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


class TokenCounter(Protocol):
    """Counts a prompt's tokens as the engine will (``PromptCounter`` for llama.cpp,
    ``canarystack.engine.vllm.VllmPromptCounter`` for vLLM)."""

    def completion(self, prompt: str) -> int: ...

    def chat(self, messages: list[dict[str, str]]) -> int: ...


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (C code writes there, below Python's logging)."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class PromptCounter:
    """Counts prompt tokens with the engine's own tokenizer (a vocab-only llama.cpp load),
    the way llama_cpp.server tokenizes completions (BOS, special tokens parsed) and chat
    (the llama-2 template the child is started with)."""

    def __init__(self, model_path: Path) -> None:
        from llama_cpp import Llama

        with _quiet_stderr():  # llama.cpp prints a context warning even with verbose=False
            self._llama = Llama(str(model_path), vocab_only=True, verbose=False)

    def completion(self, prompt: str) -> int:
        if prompt == "":
            return 1  # the engine evaluates the BOS token alone
        return len(self._llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=True))

    def chat(self, messages: list[dict[str, str]]) -> int:
        from llama_cpp.llama_chat_format import format_llama2

        formatted = format_llama2(messages=messages)
        return len(
            self._llama.tokenize(
                formatted.prompt.encode("utf-8"),
                add_bos=not formatted.added_special,
                special=True,
            )
        )
