"""What the loss scores in a chat: the assistant turns, found through the chat template.

Two ways, the first where the template allows it:

- **generation mask** — the template marks assistant text with ``{% generation %}`` and
  transformers returns ``assistant_masks`` (``return_assistant_tokens_mask=True``): exactly
  the tokens inside the markers (the content and the end-of-turn token, not the role header).
- **prefix difference** — otherwise, for each assistant turn ``i`` the template renders
  ``messages[:i]`` with the generation prompt (A) and ``messages[:i+1]`` (B); what B adds
  after A is scored. This includes whatever the template writes after the turn before the
  next one (ChatML's newline after ``<|im_end|>``), one token more per turn than the
  generation mask on such templates. A template that renders earlier turns differently
  once a later one is added (A is not a prefix of B) cannot be read this way: that row is a
  problem. Conversational prompt/completion rows (TRL) always use this way, with A the
  prompt and its generation prompt, as TRL does.

Both work on character spans of the rendered text mapped to tokens through the fast
tokenizer's offsets, one batched tokenizer call per batch of rows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def template_of(tokenizer: Any) -> str | None:
    """The tokenizer's default chat template text, or None when it has none."""
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):
        t = t.get("default")
    return t if isinstance(t, str) and t.strip() else None


def has_generation_markers(template: str | None) -> bool:
    """Whether the template marks assistant text with ``{% generation %}``."""
    return bool(template) and _GENERATION.search(template) is not None


class TemplateError(Exception):
    """The template cannot be read for this row (the reason is the message)."""


def render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool = False) -> str:
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as e:  # jinja raises its own errors for a template's exceptions
        raise TemplateError(f"cannot be rendered by the tokenizer's chat template ({type(e).__name__}: "
                            f"{str(e)[:120]})") from None
    if not isinstance(out, str):
        raise TemplateError("renders to something other than text through the chat template")
    return out


def assistant_spans(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the character spans of its assistant turns (prefix difference)."""
    full = render(tokenizer, messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        a = render(tokenizer, messages[:i], generation_prompt=True)
        b = render(tokenizer, messages[: i + 1])
        if not b.startswith(a) or not full.startswith(b):
            raise TemplateError(
                f"renders turn {i} differently once later turns are added, so its assistant tokens cannot be found by "
                "prefix; use a chat template with {% generation %} markers"
            )
        spans.append((len(a), len(b)))
    return full, spans


def completion_span(tokenizer: Any, prompt: list[dict[str, Any]],
                    completion: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """A conversational prompt/completion rendered, and the span of the completion."""
    a = render(tokenizer, prompt, generation_prompt=True)
    full = render(tokenizer, prompt + completion)
    if not full.startswith(a):
        raise TemplateError("renders its prompt differently once the completion is added, so the completion cannot be "
                            "found by prefix")
    return full, [(len(a), len(full))]


def token_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """Which tokens overlap a character span ``[a, b)``; ``offsets`` are the tokens' ``(start, end)``.

    >>> token_mask([(0, 2), (2, 4), (4, 6)], [(3, 6)])
    [False, True, True]
    """
    out = []
    for s, e in offsets:
        if e <= s:  # a token with no characters (rare): belongs to the span it sits in
            out.append(any(a <= s < b for a, b in spans))
        else:
            out.append(any(s < b and e > a for a, b in spans))
    return out


def masked_labels(ids: Sequence[int], mask: Sequence[Any]) -> list[int]:
    """``labels``: the id where the mask is set, -100 elsewhere."""
    return [t if m else -100 for t, m in zip(ids, mask)]
