"""A model folder's chat template, rendered as transformers renders it.

The template is tokenizer_config.json's ``chat_template`` (a string, or a list
of named templates of which ``default`` is taken) or, where transformers
writes it now, ``chat_template.jinja`` beside it. It is rendered with jinja2
in an immutable sandbox (a template cannot touch Python objects or change the
messages), with ``trim_blocks`` and ``lstrip_blocks`` and the loop-control
extension, as ``transformers.apply_chat_template`` does, and the same helpers:
``raise_exception(message)``, ``strftime_now(format)``, a ``tojson`` filter
that keeps non-ASCII text, and the ``{% generation %}`` block (rendered as its
body). Its variables: ``messages`` (each a dict with ``role`` and ``content``),
``add_generation_prompt``, ``tools`` and ``documents`` (None), the special
tokens (``bos_token``, ``eos_token``, ...), and whatever keywords the caller
adds (``enable_thinking=False``, say).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from ..errors import InvalidArgument, InvalidModel


def _jinja() -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise InvalidArgument("chat templates need jinja2: pip install 'onnxep[text]'") from None
    return jinja2


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    jinja2 = _jinja()
    from jinja2 import nodes

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's
        tokens with it; rendering, it is its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> list[nodes.Node]:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise InvalidModel(
            f"the chat template does not parse (line {exc.lineno}: {exc.message})"
        ) from None


def pick_template(value: Any, where: str) -> str | None:
    """tokenizer_config.json's ``chat_template`` value as one template (None: none)."""
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default") or (next(iter(named.values())) if len(named) == 1 else None)
        if isinstance(chosen, str):
            return chosen
    raise InvalidModel(
        f"{where}: chat_template must be a template string or a list of named templates "
        "with a 'default' one"
    )


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as a list of dicts with a string ``role`` and ``content``."""
    ok = isinstance(messages, Sequence) and not isinstance(messages, str) and messages
    for m in messages if ok else ():
        if not (
            isinstance(m, Mapping)
            and isinstance(m.get("role"), str)
            and "content" in m
            and isinstance(m["content"], str | list | type(None))
        ):
            ok = False
            break
    if not ok:
        raise InvalidArgument(
            "a chat must be a non-empty list of messages, each a dict with a 'role' and a "
            f"'content' string, e.g. [{{'role': 'user', 'content': 'Hi'}}]; got {messages!r:.80}"
        )
    return [dict(m) for m in messages]


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str | None] | None = None,
    **variables: Any,
) -> str:
    """The prompt text ``template`` makes of ``messages``."""
    jinja2 = _jinja()
    compiled = _compiled(template)
    context = {"tools": None, "documents": None, **dict(special_tokens or {}), **variables}
    try:
        return compiled.render(
            messages=check_messages(messages),
            add_generation_prompt=add_generation_prompt,
            **context,
        )
    except (jinja2.exceptions.TemplateError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"the chat template refused the messages: {exc}") from None
