"""Chat templates from model files, rendered only inside a Jinja sandbox, under limits.

A template is untrusted content: it comes with a downloaded model. The immutable sandbox
refuses attribute access to Python internals (``__class__``, ``__globals__``, ...) and
mutation of the objects passed in; such a template fails with a clear error instead.

A template is also a program, so rendering is bounded (`TemplateLimits`): the size of the
output and of anything built on the way, the steps taken (loop iterations, calls, lookups,
operators), how deeply calls nest (recursive macros) and the wall time. Operations that
could build something huge in one go (``'x' * 10**10``, ``range(10**9)``, a format width of
a billion, joining a list of shared references) are checked before they run; everything
else is checked between steps, so the deadline holds without a thread to watch it. A
template over a limit is refused with a one-line reason.
"""

from __future__ import annotations

import functools
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Iterator, Optional

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

from specdesk.engines.types import SpecDeskError

FALLBACK_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@dataclass(frozen=True)
class TemplateLimits:
    max_chars: int = 1_000_000  # output, and any one value built while rendering (plus twice the messages' size)
    max_steps: int = 1_000_000  # loop iterations, calls, attribute and item lookups, checked operators
    max_depth: int = 64  # nested calls: recursive macros and recursive loops
    max_seconds: float = 2.0
    max_range: int = 100_000  # items in one range(), as in Jinja's own sandbox
    max_source_chars: int = 256_000  # the template text itself (real templates are a few kB)
    max_int_bits: int = 65_536  # integers built by arithmetic


# Values printed while rendering may add up to this many times the output limit: macros and
# blocks print text again at each level, but a loop printing fresh copies must end.
PRODUCED_FACTOR = 10


class TemplateLimitExceeded(Exception):
    """A template went over one of its limits (turned into a SpecDeskError naming the template)."""


# The checking filters the syntax rewrite inserts (a template that names one itself only
# gets the same check).
_ITER, _CONCAT, _BUILT = "_specdesk_iter", "_specdesk_concat", "_specdesk_built"
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*?:([^{}]*)\}")
_NUMBER = re.compile(r"\d+")


class _Budget:
    def __init__(self, limits: TemplateLimits, max_chars: int):
        self.limits = limits
        self.max_chars = max_chars
        self.steps = 0
        self.depth = 0
        self.produced = 0  # characters of all output values so far, kept or not
        self._sizes: dict[int, tuple[Any, int]] = {}  # id -> (container, size): see size()
        # The render's own CPU time, not the clock: a template that loops burns it, while a machine
        # busy with other work does not make an honest template look like one that hangs.
        self.deadline = time.thread_time() + limits.max_seconds

    def tick(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps > self.limits.max_steps:
            raise TemplateLimitExceeded(f"it took more than {self.limits.max_steps:,} steps")
        if time.thread_time() > self.deadline:
            raise TemplateLimitExceeded(f"it ran longer than {self.limits.max_seconds:g} s")

    def allow(self, size: int, what: str) -> None:
        """Refuse building a value of `size` characters (or items)."""
        if size > self.max_chars:
            raise TemplateLimitExceeded(f"{what} would be {_amount(size)} characters, over the limit of "
                                        f"{self.max_chars:,}")

    def size(self, value: Any) -> int:
        """Characters `value` takes when printed, counting shared references each time they
        appear (as printing does); stops counting once over the limit."""
        container = isinstance(value, (list, tuple, dict, set, frozenset))
        if container:
            # Containers cannot change while rendering (the immutable sandbox), and templates
            # ask `messages|length` inside loops over messages: walk each one once.
            known = self._sizes.get(id(value))
            if known is not None and known[0] is value:
                return known[1]
        total = self._walk(value)
        if container:
            if len(self._sizes) >= 256:  # a few recent ones are what repeats; keep memory flat
                self._sizes.clear()
            self._sizes[id(value)] = (value, total)
        return total

    def _walk(self, value: Any) -> int:
        total = 0
        stack = [value]
        visited = 0
        while stack:
            item = stack.pop()
            visited += 1
            if visited % 4096 == 0:
                self.tick(0)
            if isinstance(item, str):
                total += len(item) + 2
            elif isinstance(item, bool) or item is None:
                total += 5
            elif isinstance(item, int):
                bits = item.bit_length()
                if bits > self.limits.max_int_bits:
                    raise TemplateLimitExceeded(f"an integer of {bits:,} bits is over the limit of "
                                                f"{self.limits.max_int_bits:,}")
                total += bits // 3 + 2
            elif isinstance(item, dict):
                total += 2 + 2 * len(item)
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, (list, tuple, set, frozenset)):
                total += 2 + 2 * len(item)
                stack.extend(item)
            elif isinstance(item, bytes):
                total += 4 * len(item) + 3
            else:
                total += 32
            if total > self.max_chars:
                return total
        return total

    def check(self, value: Any, what: str) -> Any:
        self.allow(self.size(value), what)
        return value


def _amount(size: int) -> str:
    return f"{size:,}" if size < 10**15 else f"about 10^{int(math.log10(size))}"


class _GuardSyntax(NodeTransformer):
    """Rewrites the parsed template so that every loop, `~` concatenation and literal
    list/tuple/dict passes through a checking filter (Jinja has no hook for these)."""

    def _filter(self, node: nodes.Expr, name: str) -> nodes.Filter:
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    def visit_For(self, node: nodes.For) -> nodes.For:
        node = self.generic_visit(node)
        node.iter = self._filter(node.iter, _ITER)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Filter:
        node = self.generic_visit(node)
        return self._filter(nodes.List(node.nodes, lineno=node.lineno), _CONCAT)

    def _literal(self, node: nodes.Expr) -> nodes.Expr:
        node = self.generic_visit(node)
        if getattr(node, "ctx", "load") != "load":  # an assignment target, not a value
            return node
        return self._filter(node, _BUILT)

    visit_List = visit_Tuple = visit_Dict = _literal


class _GenerationTag(Extension):
    """transformers' {% generation %} ... {% endgeneration %}: its body, unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _LimitedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, budget: _Budget):
        # optimized=False: constant folding would run operators at compile time, unchecked.
        # The extensions are transformers' own for chat templates: {% break %} / {% continue %},
        # and {% generation %} (marks the assistant's text for training masks; rendered as is).
        super().__init__(trim_blocks=True, lstrip_blocks=True, optimized=False, finalize=self._finalize_output,
                         extensions=[loopcontrols, _GenerationTag])
        self.budget = budget
        self.concat = self._concat  # joins the output of macros, call blocks and {% set %} blocks
        self.globals.pop("lipsum", None)  # lipsum(n=10**6) is a long loop no step counter sees
        self._checked_range = self._range  # one bound method, so `call` can recognise it
        self.globals["range"] = self._checked_range
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now  # transformers and llama.cpp give templates the date
        self.filters = {name: self._guarded_filter(name, f) for name, f in self.filters.items()}
        self.filters[_ITER] = self._iterate
        self.filters[_CONCAT] = self._concat_values
        self.filters[_BUILT] = lambda value: budget.check(value, "a literal")

    # --- hooks the sandbox offers -------------------------------------------------
    def call(self, context, obj, /, *args: Any, **kwargs: Any) -> Any:
        budget = self.budget
        budget.tick()
        if obj is not self._checked_range:  # range() checks its own length
            args = _check_arguments(budget, obj, args, kwargs)
        budget.depth += 1
        try:
            if budget.depth > budget.limits.max_depth:
                raise TemplateLimitExceeded(f"calls nest deeper than {budget.limits.max_depth} "
                                            "(a macro that calls itself without end?)")
            result = super().call(context, obj, *args, **kwargs)
        finally:
            budget.depth -= 1
        return budget.check(result, f"the result of {_name(obj)}")

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        budget = self.budget
        budget.tick()
        _check_binop(budget, operator, left, right)
        return budget.check(super().call_binop(context, operator, left, right), f"'{operator}'")

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.budget.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.budget.tick()
        return super().getitem(obj, argument)

    # --- what the syntax rewrite and the output use ------------------------------
    def _finalize_output(self, value: Any) -> Any:
        """Every {{ value }}, in the output or in a macro's or {% set %} block's: the blocks
        keep their pieces until they end, so what all of them produce is bounded too."""
        budget = self.budget
        budget.produced += budget.size(value)
        if budget.produced > PRODUCED_FACTOR * budget.max_chars:
            raise TemplateLimitExceeded(f"its output values add up to more than {PRODUCED_FACTOR} times the "
                                        f"output limit of {budget.max_chars:,} characters")
        return budget.check(value, "one output value")

    def _concat(self, pieces: Iterable[str]) -> str:
        pieces = list(pieces)
        self.budget.allow(sum(len(p) for p in pieces), "a block's output")
        return "".join(pieces)

    def _concat_values(self, values: list) -> str:
        self.budget.allow(sum(self.budget.size(v) for v in values), "a '~' concatenation")
        return "".join(str(v) for v in values)

    def _iterate(self, iterable: Any) -> Iterator:
        budget = self.budget
        for item in iterable:
            budget.tick()
            yield item

    def _range(self, *args: int) -> range:
        numbers = range(*args)
        try:
            count = len(numbers)
        except OverflowError:  # more items than a C integer counts: len() cannot say how many
            count = (abs(numbers.stop - numbers.start) + abs(numbers.step) - 1) // abs(numbers.step)
        if count > self.budget.limits.max_range:
            raise TemplateLimitExceeded(f"range({', '.join(map(str, args))}) has {_amount(count)} items, "
                                        f"over the limit of {self.budget.limits.max_range:,}")
        return numbers

    def _guarded_filter(self, name: str, function):
        budget = self.budget
        # Filters marked pass_context / pass_environment get that first: the value comes next.
        first = 1 if hasattr(function, "jinja_pass_arg") else 0

        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            budget.tick()
            args = list(args)
            if len(args) > first and not isinstance(args[first], (str, list, tuple, dict)) \
                    and hasattr(args[first], "__next__"):
                args[first] = list(_bounded(budget, args[first]))  # a generator: see what it holds
            _check_filter(budget, name, args[first:], kwargs)
            return budget.check(function(*args, **kwargs), f"the result of the filter '{name}'")

        return guarded


def _raise_exception(message: str):
    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    """Today's date in a template's format (Llama 3.x prints "Today Date: 26 Jul 2024")."""
    if not isinstance(format, str) or len(format) > 100:
        raise TemplateLimitExceeded("strftime_now takes a format string of at most 100 characters")
    return datetime.now().strftime(format)


def _name(obj: Any) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__


def _bounded(budget: _Budget, items: Iterable) -> Iterator:
    for count, item in enumerate(items):
        if count % 256 == 0:
            budget.tick()
        if count > budget.max_chars:
            budget.allow(count, "a sequence")
        yield item


def _check_arguments(budget: _Budget, obj: Any, args: tuple, kwargs: dict) -> tuple:
    """Before a call: no argument over the limits, and for the string methods that multiply
    their input, the size of what they would build. Returns the arguments to call with (a
    generator given to str.join is read here, so the call gets what it held)."""
    target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    text = getattr(target, "__self__", None)
    if isinstance(text, str) and getattr(target, "__name__", "") == "join" and args \
            and not isinstance(args[0], (list, tuple)):
        args = (list(_bounded(budget, args[0])), *args[1:])
    values = (*args, *kwargs.values())
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > budget.max_chars:
            raise TemplateLimitExceeded(f"{_name(obj)}() was given {_amount(abs(value))}, over the limit of "
                                        f"{budget.max_chars:,}")
        budget.check(value, f"an argument of {_name(obj)}()")
    if isinstance(text, str):
        _check_string_method(budget, text, getattr(target, "__name__", ""), args, kwargs)
    return args


def _check_string_method(budget: _Budget, text: str, method: str, args: tuple, kwargs: dict) -> None:
    if method == "join" and args and isinstance(args[0], (list, tuple)):
        budget.allow(sum(budget.size(i) for i in args[0]) + len(text) * len(args[0]), "a join")
    elif method == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _check_replace(budget, text, args[0], args[1], args[2] if len(args) > 2 else -1)
    elif method == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            budget.allow(len(text) + text.count("\t") * max(tab, 0), "expandtabs()")
    elif method in ("format", "format_map"):
        values = [*args, *kwargs.values()]
        if method == "format_map" and args and isinstance(args[0], dict):
            values = list(args[0].values())
        _check_format(budget, text, _BRACE_SPEC.findall(text), text.count("{"), values)


def _check_replace(budget: _Budget, text: str, old: str, new: str, count: Any) -> None:
    found = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    budget.allow(len(text) + found * max(0, len(new) - len(old)), "a replace")


def _check_format(budget: _Budget, text: str, specs: list, fields: int, values: list) -> None:
    """A format string builds at most its own text, each field's widest value, and the
    widths and precisions its specs ask for."""
    widths = sum(int(n) for spec in specs for n in _NUMBER.findall(spec if isinstance(spec, str) else " ".join(spec)))
    widths += sum(abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool))  # '*' widths
    widest = max((budget.size(v) for v in values), default=0)
    budget.allow(len(text) + fields * widest + widths, "a formatted string")


def _check_binop(budget: _Budget, operator: str, left: Any, right: Any) -> None:
    sequence = (str, list, tuple)
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, sequence) and isinstance(times, int):
                one = len(seq) if isinstance(seq, str) else budget.size(seq)
                budget.allow(one * max(times, 0), "a repetition")
                return
        if isinstance(left, int) and isinstance(right, int):
            _check_bits(budget, left.bit_length() + right.bit_length())
    elif operator == "+" and isinstance(left, sequence) and isinstance(right, sequence):
        budget.allow(budget.size(left) + budget.size(right), "a '+'")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        _check_bits(budget, left.bit_length() * right)
    elif operator == "%" and isinstance(left, str):
        values = list(right.values()) if isinstance(right, dict) else \
            list(right) if isinstance(right, tuple) else [right]
        _check_format(budget, left, _PERCENT_SPEC.findall(left), left.count("%"), values)


def _check_bits(budget: _Budget, bits: int) -> None:
    if bits > budget.limits.max_int_bits:
        raise TemplateLimitExceeded(f"an integer of about {_amount(bits)} bits is over the limit of "
                                    f"{budget.limits.max_int_bits:,}")


def _check_filter(budget: _Budget, name: str, args: list, kwargs: dict) -> None:
    """Before a filter runs: its arguments within the limits, and for the filters that
    multiply their input, the size of what they would build."""
    for value in (*args[1:], *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > budget.max_chars:
            raise TemplateLimitExceeded(f"the filter '{name}' was given {_amount(abs(value))}, over the limit of "
                                        f"{budget.max_chars:,}")
    sizes = [budget.size(v) for v in (*args, *kwargs.values())]
    budget.allow(sum(sizes), f"the input of the filter '{name}'")
    value = args[0] if args else None
    arguments = list(args[1:])

    def argument(position: int, keyword: str, default: Any) -> Any:
        return arguments[position] if len(arguments) > position else kwargs.get(keyword, default)

    if name == "join" and isinstance(value, (list, tuple)):
        separator = argument(0, "d", "")
        budget.allow(sum(sizes[:1]) + budget.size(separator) * len(value), "a join")
    elif name == "replace" and isinstance(value, str):
        old, new = argument(0, "old", ""), argument(1, "new", "")
        if isinstance(old, str) and isinstance(new, str):
            _check_replace(budget, value, old, new, argument(2, "count", -1))
    elif name == "indent" and isinstance(value, str):
        width = argument(0, "width", 4)
        per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        budget.allow(len(value) + (value.count("\n") + 1) * per_line, "an indent")
    elif name == "wordwrap" and isinstance(value, str):
        width = argument(0, "width", 79)
        wrap = argument(2, "wrapstring", None) or "\n"
        lines = len(value) // max(1, width if isinstance(width, int) else 1) + value.count("\n") + 1
        budget.allow(len(value) + lines * len(str(wrap)), "a wordwrap")
    elif name == "format" and isinstance(value, str):
        _check_format(budget, value, _PERCENT_SPEC.findall(value), value.count("%"),
                      [*arguments, *kwargs.values()])
    elif name in ("center", "truncate") and isinstance(value, str):
        width = argument(0, "width" if name == "center" else "length", 0)
        if isinstance(width, int):
            budget.allow(len(value) + max(width, 0), f"the filter '{name}'")


def _message_chars(messages: Any) -> int:
    """Characters of text in the messages (their own size raises the limits, so a long
    conversation is never refused for being long)."""
    total, stack = 0, [messages]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def render_chat(template: Optional[str], messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, source: str = "the model",
                limits: TemplateLimits = TemplateLimits()) -> str:
    """The prompt text for `messages` in the model's chat template (or a plain fallback).

    A template that refuses a system message (Gemma's raise "System role not supported")
    gets the system prompt at the start of the first user message instead, as those models'
    own instructions say to do."""
    try:
        return _render(template, messages, bos_token, eos_token, add_generation_prompt, source, limits)
    except _RenderFailed as failure:
        folded = fold_system_prompt(messages)
        if folded is messages:
            raise
        try:
            return _render(template, folded, bos_token, eos_token, add_generation_prompt, source, limits)
        except _RenderFailed:
            raise failure from failure.__cause__  # the first failure says more


def fold_system_prompt(messages: list[dict]) -> list[dict]:
    """The messages with a leading system message moved into the first user message (a blank
    line between them); the same list when there is nothing to move."""
    if len(messages) < 2 or messages[0].get("role") != "system" or messages[1].get("role") != "user":
        return messages
    system, first = messages[0], messages[1]
    return [{**first, "content": f"{system.get('content', '')}\n\n{first.get('content', '')}"}] + list(messages[2:])


class _RenderFailed(SpecDeskError):
    """The template raised or failed to render (as opposed to being refused or stopped)."""


def _render(template: Optional[str], messages: list[dict], bos_token: str, eos_token: str,
            add_generation_prompt: bool, source: str, limits: TemplateLimits) -> str:
    source_text = template or FALLBACK_TEMPLATE
    if len(source_text) > limits.max_source_chars:
        raise SpecDeskError(f"the chat template of {source} was refused: it is {len(source_text):,} characters, "
                            f"over the limit of {limits.max_source_chars:,}")
    budget = _Budget(limits, limits.max_chars + 2 * _message_chars(messages))
    environment = _LimitedEnvironment(budget)
    try:
        tree = _GuardSyntax().visit(environment.parse(source_text))
        tree.set_environment(environment)
        compiled = environment.from_string(tree)
        pieces, length = [], 0
        for piece in compiled.generate(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                       add_generation_prompt=add_generation_prompt):
            length += len(piece)
            budget.allow(length, "the output")
            pieces.append(piece)
        return "".join(pieces)
    except TemplateLimitExceeded as e:
        raise SpecDeskError(f"the chat template of {source} was stopped: {e}") from None
    except SecurityError as e:
        raise SpecDeskError(f"the chat template of {source} was refused: it reaches for Python internals ({e})") from e
    except TemplateError as e:
        raise _RenderFailed(f"the chat template of {source} failed to render: {_one_line(e)}") from e
    except RecursionError:
        raise SpecDeskError(f"the chat template of {source} failed to render: it nests too deeply") from None
    except MemoryError:
        raise SpecDeskError(f"the chat template of {source} failed to render: it ran out of memory") from None
    except Exception as e:  # a template is untrusted code: whatever it raises is its failure, in one line
        raise _RenderFailed(f"the chat template of {source} failed to render: "
                            f"{type(e).__name__}: {_one_line(e)}") from e


def _one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
