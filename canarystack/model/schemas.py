"""Request bodies of the OpenAI-compatible endpoints, as pydantic models.

This module must never build responses: output is pre-encoded in
``canarystack.model.render`` to keep pydantic off the per-token path.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from canarystack.tokenizer import render_chat

MAX_LOGPROBS = 20
# OpenAI accepts at most 4 stop sequences; each is matched against the text per token.
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 1024


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Request(_Body):
    """Unknown fields are accepted and ignored (clients send many); known fields are checked
    strictly, and a wrong one becomes a 400 that names it (``canarystack.common.errors``).
    Fields the simulated engine cannot honour (``n`` > 1, ``best_of`` > 1, a streamed
    ``echo``) are refused with a message that says so rather than silently ignored.
    """

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = None
    stop: Any = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    best_of: int | None = None

    # ``echo`` and ``logprobs`` are fields of one kind of request each (hence not checked).
    @field_validator(
        "temperature", "top_p", "stream", "n", "echo", "logprobs", mode="before", check_fields=False
    )
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        # Some OpenAI clients send null for "use the default".
        if value is None and info.field_name is not None:
            return cls.model_fields[info.field_name].default
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError(
                f"n={value} is not supported: the simulated engine returns one choice; "
                "send n=1 (or leave it out) and make one request per completion"
            )
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError(f"best_of={value} is not supported; leave it out or send 1")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: Any) -> Any:
        if value is None:
            return None
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise ValueError("stop must be a string or a list of strings")
        if len(items) > MAX_STOP_SEQUENCES:
            raise ValueError(f"stop has {len(items)} sequences; at most {MAX_STOP_SEQUENCES}")
        if any(s == "" for s in items):
            raise ValueError("stop sequences must not be empty strings")
        if any(len(s) > MAX_STOP_CHARS for s in items):
            raise ValueError(f"each stop sequence may have at most {MAX_STOP_CHARS} characters")
        return items

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(
        cls, value: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        if value is not None and not info.data.get("stream", False):
            raise ValueError(
                "stream_options is only allowed with stream: true; drop it or set stream"
            )
        return value

    @property
    def stop_sequences(self) -> list[str]:
        return list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    prompt: Any = Field(...)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            return value[0]
        raise ValueError(
            "prompt must be a string (or a list holding exactly one string); "
            "batched prompts and token-id prompts are not supported"
        )

    @field_validator("echo")
    @classmethod
    def _echo_not_streamed(cls, value: bool, info: ValidationInfo) -> bool:
        # echo answers the prompt's own logprobs (teacher-forced scoring): one JSON answer.
        if value and info.data.get("stream"):
            raise ValueError(
                "echo is answered without streaming by the simulated engine; send "
                '"stream": false with "echo": true'
            )
        return value

    def prompt_text(self) -> str:
        return str(self.prompt)


class ChatMessage(_Body):
    role: str = Field(min_length=1)
    content: Any = None

    @field_validator("content")
    @classmethod
    def _text_content(cls, value: Any) -> str:
        """The message text: a string, null, or OpenAI text content parts (joined)."""
        if value is None or isinstance(value, str):
            return value or ""
        if isinstance(value, list):
            texts = []
            for part in value:
                if not (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    raise ValueError(
                        "content parts must be text parts like "
                        '{"type": "text", "text": "..."}; other kinds are not supported'
                    )
                texts.append(part["text"])
            return " ".join(texts)
        raise ValueError("content must be a string, a list of text parts, or null")


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs", False):
            raise ValueError("top_logprobs needs logprobs: true; set it or drop top_logprobs")
        return value

    def prompt_text(self) -> str:
        return render_chat({"role": m.role, "content": m.content} for m in self.messages)


def first_user_message(req: CompletionRequest | ChatCompletionRequest) -> str:
    """What a conversation's retrieved context is keyed by (``canarystack.dependency.keys``),
    the same for the simulator and the engine pod, so a context seeded once is found by both
    variants: a completion's prompt, a chat's first user message (its first message when
    none is the user's)."""
    if isinstance(req, CompletionRequest):
        return req.prompt_text()
    for message in req.messages:
        if message.role == "user":
            return str(message.content)
    return str(req.messages[0].content) if req.messages else ""
