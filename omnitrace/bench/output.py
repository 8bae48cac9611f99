"""Where `omnitrace bench` puts bench.json, and how it never loses or replaces results.

* Before the load: a file already at ``--out`` is another run's results, refused unless
  ``--overwrite``; a destination that cannot be written (no such folder, read-only) is
  refused too. Both in one line, exit 2, nothing sent.
* The first write creates the file without replacing one that appeared meanwhile (a
  hard link of a complete temporary file: a reader never sees half a file); later writes
  replace our own file atomically.
* A write that fails (disk full, folder removed) is one warning line; the results stay
  in memory. If the final write fails too, they go to a new file in the temp folder
  (``$TMPDIR``), and if even that fails, to stdout as one JSON line. Either way the
  message says where they are and the exit status is 1.
"""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import orjson
from omnitrace import console


class OutputError(Exception):
    """One line for the user: the destination is refused before anything runs."""


def _dump(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2)


def _temp_beside(path: str, data: bytes) -> str:
    """A complete copy of ``data`` in a new file in ``path``'s folder (removed on failure)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".bench-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        os.unlink(tmp)  # a partial file on a full disk would only take more of it
        raise
    return tmp


def _create(path: str, tmp: str) -> None:
    """Move ``tmp`` to ``path`` only if ``path`` does not exist (FileExistsError if it does)."""
    try:
        os.link(tmp, path)  # atomic and never replaces
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links: reserve the name, then replace it
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _safe_copy(data: bytes) -> str:
    """The results in a new file in the temp folder (removed again if it cannot be completed)."""
    fd, safe = tempfile.mkstemp(prefix="omnitrace-bench-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        os.unlink(safe)
        raise
    return safe


class BenchOutput:
    def __init__(self, path: str | None, overwrite: bool) -> None:
        self.path = path
        self.owned = overwrite  # True: replacing what is at ``path`` is ours to do
        self.error: str | None = None  # why the last write failed
        self.warned = False

    def check(self) -> None:
        """Refuse, before the load, a destination that holds results or cannot be written."""
        if not self.path:
            return
        if os.path.isdir(self.path):
            raise OutputError(f"--out {self.path}: is a directory (give a file, e.g. {self.path}/bench.json)")
        if os.path.lexists(self.path) and not self.owned:
            raise OutputError(f"{self.path} already holds bench results; pass --overwrite to replace "
                              "them, or --out another file")
        try:
            os.unlink(_temp_beside(self.path, b""))
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def write(self, doc: dict[str, Any]) -> bool:
        """Write ``doc`` to the destination; False (and a warning, once) if it failed."""
        if not self.path:
            return False
        try:
            tmp = _temp_beside(self.path, _dump(doc))
            try:
                if self.owned:
                    os.replace(tmp, self.path)
                else:
                    _create(self.path, tmp)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        except FileExistsError:
            self.error = "another process created it meanwhile (left as it is)"
        except OSError as exc:
            self.error = exc.strerror or str(exc)
        else:
            self.owned, self.error = True, None
            return True
        if not self.warned:
            self.warned = True
            console.say("bench", f"warning: cannot write {self.path} ({self.error}); the results "
                        "are kept and written at the end")
        return False

    def finish(self, doc: dict[str, Any]) -> str | None:
        """The final write: the path the results are in, or None (no --out and no run dir,
        or printed on stdout as the last resort)."""
        if not self.path:
            return None
        if self.write(doc):
            return self.path
        try:
            safe = _safe_copy(_dump(doc))
        except OSError as exc:
            console.say("bench", f"cannot write {self.path} ({self.error}) nor a copy in "
                        f"{tempfile.gettempdir()} ({exc.strerror or exc}); the results follow on "
                        "stdout as one JSON line")
            sys.stdout.write(orjson.dumps(doc).decode() + "\n")
            return None
        console.say("bench", f"cannot write {self.path} ({self.error}); the results are in "
                    f"{safe} instead")
        return safe
