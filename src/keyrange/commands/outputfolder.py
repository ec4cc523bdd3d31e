"""A command's output folder, made before anything starts, with an error that names its option."""

from __future__ import annotations

import os
from pathlib import Path

from keyrange.errors import UserError


def make_output_folder(path: Path, option: str) -> Path:
    """Create `path` and its parents if missing and return it; UserError naming `option` when the
    folder cannot be made or written (a file in its way, no permission), instead of a traceback
    after the broker and the workers started."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot make the folder ({exc.strerror}); pick another {option}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: the folder is not writable; pick another {option}")
    return path
