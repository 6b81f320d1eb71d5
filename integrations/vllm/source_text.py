"""Python text that builds a frozen dataclass value: how a shrunk program is printed, so that a
report's reader can paste it and run it (`integrations.vllm.shrink.program_source`,
`integrations.vllm.dllm_shrink.dllm_program_source`)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


def dataclass_source(
    value: object, skip: tuple[str, ...] = (), always: tuple[str, ...] = ()
) -> str:
    """`Type(name=value, ...)` for the dataclass instance `value`: the fields in `always` and
    those that differ from their defaults, but those in `skip`."""
    shown = []
    for f in dataclasses.fields(value):  # type: ignore[arg-type]
        v = getattr(value, f.name)
        default = f.default is not dataclasses.MISSING and v == f.default
        if f.name in skip or (default and f.name not in always):
            continue
        shown.append(f"{f.name}={literal_source(v)}")
    return f"{type(value).__name__}({', '.join(shown)})"


def literal_source(value: object) -> str:
    """Python for `value`: an enum member by name, a run of consecutive token ids as a range,
    anything else as its `repr`."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if (
        isinstance(value, tuple)
        and len(value) > 2
        and value == tuple(range(value[0], value[-1] + 1))
    ):
        return f"tuple(range({value[0]}, {value[-1] + 1}))"
    return repr(value)


def program_text(program: Any, settings: str) -> str:
    """A program of steps (`arrivals`, `aborts`, and `inputs` where it has some) as
    `Type(settings, arrivals=(...), aborts=..., inputs=(...))`, one line per step of arrivals
    and of inputs (`request_text`)."""
    lines = [f"{type(program).__name__}(\n    {settings},\n    arrivals=("]
    for batch in program.arrivals:
        requests = "".join(f"{request_text(r)}, " for r in batch)
        lines.append(f"        ({requests.rstrip()}),")
    lines.append("    ),")
    lines.append(f"    aborts={program.aborts!r},")
    inputs = getattr(program, "inputs", ())
    if inputs:  # streaming-input sessions' later inputs, one line per step
        lines.append("    inputs=(")
        for step in inputs:
            items = "".join(f"{request_text(item)}, " for item in step)
            lines.append(f"        ({items.rstrip()}),")
        lines.append("    ),")
    lines.append(")")
    return "\n".join(lines)


def request_text(request: Any) -> str:
    """A request (a dataclass whose first fields are `request_id`, `prompt_len`, `max_tokens`)
    as `Type('id', prompt_len, max_tokens, field=value, ...)`, the other fields only where they
    differ from their defaults."""
    name = type(request).__name__
    rest = dataclass_source(request, skip=("request_id", "prompt_len", "max_tokens"))
    rest = rest[len(name) + 1 : -1]
    head = f"{name}({request.request_id!r}, {request.prompt_len}, {request.max_tokens}"
    return f"{head}, {rest})" if rest else f"{head})"


__all__ = ["dataclass_source", "literal_source", "program_text", "request_text"]
