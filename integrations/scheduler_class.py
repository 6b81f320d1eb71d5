"""A scheduler class of one's own, named by an environment variable as `package.module.Class`.

The engines' built-ins build the engine's own scheduler class; a maintainer checking a change
writes it as a subclass and names it in the engine's variable (`SCHEDSPEC_VLLM_SCHEDULER_CLS`,
`integrations.vllm.custom_scheduler`; `SCHEDSPEC_VIDUR_SCHEDULER_CLS`,
`integrations.vidur.custom_scheduler`). This module reads and imports the name; each engine's
module says which classes it must subclass.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from spec.errors import ConfigError


def selected_class(variable: str) -> str | None:
    """The class the environment variable `variable` names, or None when unset or empty. A
    value of blanks only is a `ConfigError`: a name lost on its way, not a request for the
    engine's own class (that is the variable unset, or set to nothing)."""
    raw = os.environ.get(variable, "")
    value = raw.strip()
    if raw and not value:
        raise ConfigError(
            variable,
            raw,
            "a class named 'package.module.Class', or nothing (unset, or empty) for the "
            f"engine's own scheduler; it holds {len(raw)} blank character(s) only",
        )
    return value or None


def resolve_class(variable: str, qualname: str, form: str) -> type[Any]:
    """Import the class `qualname` (`package.module.Class`) names (the engine must be
    importable: call after its install is activated). A `ConfigError` naming `variable`, with
    `form` (what is valid, in words), when the name is malformed, its module does not import,
    or the attribute is not a class."""
    module_name, _, attribute = qualname.rpartition(".")
    if not module_name or not attribute.isidentifier():
        raise ConfigError(variable, qualname, form)
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as err:  # the user's module: what it raises is theirs
        raise ConfigError(
            variable,
            qualname,
            f"{form} (importing {module_name} raised {type(err).__name__}: {err})",
        ) from err
    if not hasattr(module, attribute):
        raise ConfigError(
            variable, qualname, f"{form} ({module_name} has no attribute {attribute!r})"
        )
    found = getattr(module, attribute)
    if not isinstance(found, type):
        what = type(found).__name__
        raise ConfigError(variable, qualname, f"{form} ({module_name}.{attribute} is {what})")
    return found
