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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def template_of(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The tokenizer's default chat template text, or None when it has none.

    Examples:
        >>> from types import SimpleNamespace
        >>> template_of(SimpleNamespace(chat_template={"default": "T", "tool_use": "U"}))
        'T'
        >>> template_of(SimpleNamespace(chat_template="  ")) is None, template_of(object()) is None
        (True, True)
    """
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):
        t = t.get("default")
    return t if isinstance(t, str) and t.strip() else None


def has_generation_markers(template: str | None) -> bool:
    """Whether the template marks assistant text with ``{% generation %}``.

    Examples:
        >>> has_generation_markers("{% generation %}{{ m.content }}{% endgeneration %}")
        True
        >>> has_generation_markers("{{ m.content }}"), has_generation_markers(None)
        (False, False)
    """
    return bool(template) and _GENERATION.search(template) is not None


class TemplateError(Exception):
    """The template cannot be read for this row (the reason is the message, a clause after "line N").

    Examples:
        >>> class Refuses:
        ...     def apply_chat_template(self, messages, **kwargs):
        ...         raise ValueError("no system role")
        >>> render(Refuses(), [{"role": "system", "content": "be brief"}])
        Traceback (most recent call last):
        ...
        leadline.corpus.chat.TemplateError: cannot be rendered by the ... chat template (ValueError: no system role)
    """


def render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], generation_prompt: bool = False) -> str:
    """The chat as text through the tokenizer's chat template; a template that fails is a :class:`TemplateError`.

    Examples:
        >>> class Tags:  # a stand-in chat template: <role>content</s> per message
        ...     chat_template = "<role>content</s>"
        ...     def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        ...         text = "".join(f"<{m['role']}>{m['content']}</s>" for m in messages)
        ...         return text + ("<assistant>" if add_generation_prompt else "")
        >>> render(Tags(), [{"role": "user", "content": "hi"}], generation_prompt=True)
        '<user>hi</s><assistant>'
    """
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as e:  # jinja raises its own errors for a template's exceptions
        raise TemplateError(f"cannot be rendered by the tokenizer's chat template ({type(e).__name__}: "
                            f"{str(e)[:120]})") from None
    if not isinstance(out, str):
        raise TemplateError("renders to something other than text through the chat template")
    return out


def assistant_spans(tokenizer: PreTrainedTokenizerBase,
                    messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the character spans of its assistant turns (prefix difference).

    A turn's span runs from the end of ``messages[:i]`` rendered with the generation prompt to
    the end of ``messages[:i+1]`` rendered (see the module docstring).

    Examples:
        >>> class Tags:  # a stand-in chat template: <role>content</s> per message
        ...     chat_template = "<role>content</s>"
        ...     def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        ...         text = "".join(f"<{m['role']}>{m['content']}</s>" for m in messages)
        ...         return text + ("<assistant>" if add_generation_prompt else "")
        >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        >>> text, spans = assistant_spans(Tags(), chat)
        >>> spans, text[spans[0][0]:spans[0][1]]
        ([(23, 29)], 'yo</s>')
    """
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


def completion_span(tokenizer: PreTrainedTokenizerBase, prompt: list[dict[str, Any]],
                    completion: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """A conversational prompt/completion rendered, and the span of the completion: what follows
    the prompt rendered with its generation prompt.

    Examples:
        >>> class Tags:  # a stand-in chat template: <role>content</s> per message
        ...     chat_template = "<role>content</s>"
        ...     def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        ...         text = "".join(f"<{m['role']}>{m['content']}</s>" for m in messages)
        ...         return text + ("<assistant>" if add_generation_prompt else "")
        >>> text, spans = completion_span(Tags(), [{"role": "user", "content": "hi"}],
        ...                               [{"role": "assistant", "content": "yo"}])
        >>> text, text[spans[0][0]:spans[0][1]]
        ('<user>hi</s><assistant>yo</s>', 'yo</s>')
    """
    a = render(tokenizer, prompt, generation_prompt=True)
    full = render(tokenizer, prompt + completion)
    if not full.startswith(a):
        raise TemplateError("renders its prompt differently once the completion is added, so the completion cannot be "
                            "found by prefix")
    return full, [(len(a), len(full))]


def token_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """Which tokens overlap a character span ``[a, b)``; ``offsets`` are the tokens' ``(start, end)``.

    A token with no characters belongs to the span its start sits in.

    Examples:
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


def masked_labels(ids: Sequence[int], mask: Sequence[bool | int]) -> list[int]:
    """``labels``: the id where the mask is set, -100 elsewhere.

    Examples:
        >>> masked_labels([5, 6, 7], [False, True, True])
        [-100, 6, 7]
    """
    return [t if m else -100 for t, m in zip(ids, mask)]
