"""Owner-only files under ``var/``: the SQLite database, the secret key, the demo password.

Anyone who can read ``var/db.sqlite3`` can read session keys out of it and open the admin, so
the directory is 0700 and everything in it 0600 (directories 0700). Pure standard library: the
settings module calls it before Django is set up.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
# Files created later by this process (and the demo agents it starts) get no group/other bits.
UMASK = 0o077


def private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) owner-only, or make an existing one owner-only."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _chmod(path, DIR_MODE)


def private_file(path: Path) -> None:
    """Create ``path`` empty and owner-only if missing; make it owner-only if it exists.

    SQLite gives its -wal and -shm files the mode of the database file, so an empty database
    created here keeps them private too.
    """
    if not path.exists():
        path.touch(mode=FILE_MODE)
    _chmod(path, FILE_MODE)


def restrict_tree(root: Path) -> None:
    """Take the group and other bits off ``root`` and everything below it.

    The owner's bits stay as they are (an executable stays executable). Symbolic links are not
    followed: what they point to is not ours to change. Files we do not own (a volume prepared
    by someone else) are left as they are.
    """
    if not root.is_dir():
        return
    _chmod(root, DIR_MODE)
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(parent, name)
            if not path.is_symlink():
                _chmod(path, None)


def private_umask() -> int:
    """Make every file this process creates from now on owner-only; returns the old umask."""
    return os.umask(UMASK)


def _chmod(path: Path, mode: int | None) -> None:
    """Set ``mode``, or (None) clear the group and other bits of the current one."""
    try:
        current = stat.S_IMODE(path.stat().st_mode)
        wanted = current & ~UMASK if mode is None else mode
        if current != wanted:
            os.chmod(path, wanted)
    except PermissionError:
        pass  # not our file: nothing we may change
