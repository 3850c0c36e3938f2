"""One table of compiled artefacts kept between bertlint processes in ``bertlint/__pycache__/`` (beside the ``.pyc``
files, for this interpreter's bytecode magic), read and written with ``marshal``.

Shared by :mod:`bertlint._recache` (compiled regular expressions) and :mod:`bertlint._dataclass` (generated dataclass
methods). Writing is atomic (a temporary file renamed over the table) and skipped when bytecode writing is off; a
read-only installation, a missing or unreadable table all read as "none yet".
"""

from __future__ import annotations

import sys


def path(stem: str) -> str:
    import importlib.util
    import os

    tag = sys.implementation.cache_tag or "python"
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__",
                        f"{stem}.{tag}-{importlib.util.MAGIC_NUMBER.hex()}.marshal")


def load(stem: str) -> object:
    """The stored object, or ``None`` when there is none or it cannot be read."""
    import marshal

    try:
        with open(path(stem), "rb") as f:
            return marshal.loads(f.read())
    except Exception:  # none yet, unreadable, another interpreter's
        return None


def save(stem: str, obj: object) -> None:
    """Replace the stored object atomically; silently nothing where it cannot be written."""
    import marshal
    import os

    if sys.dont_write_bytecode:
        return
    target = path(stem)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(marshal.dumps(obj))
        os.replace(tmp, target)
    except Exception:  # a read-only installation: compile each time, as before
        try:
            os.unlink(tmp)
        except OSError:
            pass
