"""An independent witness of a server's shared-memory chunks: every segment created in and
removed from /dev/shm while it watches, named by inotify (no polling gaps), not by
omnitrace. vLLM-Omni's SharedMemoryConnector names a chunk ``<request>_<stage>_<chunk>``;
the producer creates it (one ``put``) and the consumer unlinks it once read (one ``get``)."""
from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from inotify_simple import INotify, flags

CHUNK_KEY = re.compile(r"^(?P<req>.+)_(?P<stage>\d+)_(?P<chunk>\d+)$")


@dataclass
class ShmWatcher:
    path: str = "/dev/shm"
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ino = INotify()
        self._ino.add_watch(self.path, flags.CREATE | flags.DELETE)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shm-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for ev in self._ino.read(timeout=100):
                if ev.mask & flags.CREATE:
                    self.created.append(ev.name)
                elif ev.mask & flags.DELETE:
                    self.removed.append(ev.name)

    def stop(self) -> None:
        time.sleep(0.3)  # the last events of a just-finished request
        self._stop.set()
        self._thread.join(5)
        self._ino.close()

    @staticmethod
    def chunks(names: list[str]) -> Counter:
        """(request, stage) -> chunk segments, for names of the connector's key form."""
        out: Counter = Counter()
        for n in names:
            m = CHUNK_KEY.match(n)
            if m and not n.endswith(".lock"):
                out[(m["req"], int(m["stage"]))] += 1
        return out
