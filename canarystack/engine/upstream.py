"""What the llama.cpp engine gets for a validated client request.

This module must never pass a field to the engine that the contract did not validate.
"""

from __future__ import annotations

from canarystack.common.errors import BadRequest
from canarystack.engine.tokens import TokenCounter
from canarystack.model.body import Parsed
from canarystack.model.contract import RequestRecord, check_model_name, resolve_max_tokens
from canarystack.model.schemas import ChatCompletionRequest, CompletionRequest


def upstream_body(
    parsed: Parsed,
    chat: bool,
    rec: RequestRecord,
    counter: TokenCounter,
    *,
    served: str,
    n_ctx: int,
    default_max_tokens: int,
) -> tuple[dict[str, object], bool, bool]:
    """Count and build what the engine gets from a validated request: (body, stream,
    include_usage). Only the fields the contract validates are forwarded; unknown
    fields are dropped here, never passed to the engine unchecked."""
    req = parsed.req
    messages: list[dict[str, str]] = []
    if isinstance(req, CompletionRequest):
        prompt = req.prompt_text()
        if not prompt.strip():
            raise BadRequest("'prompt' is empty: send at least one token of text.", param="prompt")
        rec.prompt_tokens = counter.completion(prompt)
    else:
        messages = [{"role": m.role, "content": str(m.content)} for m in req.messages]
        rec.prompt_tokens = counter.chat(messages)
    rec.stream = req.stream
    check_model_name(req.model, served)
    max_tokens = resolve_max_tokens(
        parsed.max_tokens,
        rec.prompt_tokens,
        max_len=n_ctx,
        default_max_tokens=default_max_tokens,
        prompt_field=parsed.prompt_field,
    )
    dropped = {"stream_options", "max_completion_tokens"}
    out = req.model_dump(mode="json", exclude_unset=True, exclude=dropped)
    out["model"] = served
    out["max_tokens"] = max_tokens
    if chat:
        out["messages"] = messages
    else:
        out["prompt"] = prompt
    return out, req.stream, req.include_usage


def add_context(
    upstream: dict[str, object],
    req: CompletionRequest | ChatCompletionRequest,
    context: str,
    counter: TokenCounter,
    n_ctx: int,
) -> int | None:
    """Put a retrieved ``context`` in front of what the engine gets — the system message
    of a chat (before its own system text, if any), a line before a completion's prompt —
    and return the prompt's new token count; None (``upstream`` unchanged) when it would
    not fit ``n_ctx`` with the answer."""
    changed: dict[str, object]
    if isinstance(req, CompletionRequest):
        prompt = f"{context}\n{upstream['prompt']}"
        tokens = counter.completion(prompt)
        changed = {"prompt": prompt}
    else:
        given = upstream["messages"]
        assert isinstance(given, list)  # upstream_body put the chat's messages there
        messages: list[dict[str, str]] = list(given)
        if messages and messages[0]["role"] == "system":
            # llama-2's template keeps one system text: the context joins it.
            first = messages[0]
            messages[0] = {**first, "content": f"{context}\n{first['content']}"}
        else:
            messages.insert(0, {"role": "system", "content": context})
        tokens = counter.chat(messages)
        changed = {"messages": messages}
    max_tokens = upstream["max_tokens"]
    assert isinstance(max_tokens, int)  # upstream_body resolved it
    if tokens + max_tokens > n_ctx:
        return None
    upstream.update(changed)
    return tokens
