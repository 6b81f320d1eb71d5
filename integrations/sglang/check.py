"""Import check for the installer: SGLang's scheduler path imports with the stubs in place.

`python -c "import integrations.sglang.check"` with the engine's `site-packages/` on PYTHONPATH
(the installer runs it before writing the stamp, so it must not require the stamp).
"""

from __future__ import annotations

from integrations.sglang.engine import import_engine

import_engine(activate=False)
