"""Chat templates from model files, rendered only inside a Jinja sandbox.

A template is untrusted content: it comes with a downloaded model. The immutable sandbox
refuses attribute access to Python internals (``__class__``, ``__globals__``, ...) and
mutation of the objects passed in; such a template fails with a clear error instead.
"""

from __future__ import annotations

from typing import Optional

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from specdesk.engines.types import SpecDeskError

FALLBACK_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def _raise_exception(message: str):
    raise TemplateError(message)


def render_chat(template: Optional[str], messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, source: str = "the model") -> str:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise_exception
    try:
        compiled = environment.from_string(template or FALLBACK_TEMPLATE)
        return compiled.render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=add_generation_prompt)
    except SecurityError as e:
        raise SpecDeskError(f"the chat template of {source} was refused: it reaches for Python internals ({e})") from e
    except TemplateError as e:
        raise SpecDeskError(f"the chat template of {source} failed to render: {e}") from e
