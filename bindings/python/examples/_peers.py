"""The examples' demos start their peers as child processes and wait for what the peers print, each
wait with a time limit: a peer that hangs fails the demo instead of holding it up forever."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time


class Peers:
    """A demo's peer processes. A thread per process reads its output into one queue, so that the
    demo waits for a line with a time limit and prints every peer's lines as they come."""

    def __init__(self, echo: bool = True):
        self.procs: dict[int, subprocess.Popen] = {}
        self.said: dict[int, list[str]] = {}
        self._echo = echo
        self._lines: queue.Queue = queue.Queue()
        self._ended: set[int] = set()

    def start(self, index: int, argv: list[str]) -> None:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs[index], self.said[index] = p, []
        threading.Thread(target=self._read, args=(index, p), daemon=True).start()

    def _read(self, index: int, p: subprocess.Popen) -> None:
        for line in p.stdout:
            self._lines.put((index, time.monotonic(), line))
        self._lines.put((index, time.monotonic(), None))

    def _next(self, deadline: float, what: str) -> tuple[int, float, str | None]:
        try:
            index, at, line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"no {what} in time") from None
        if line is None:
            self._ended.add(index)
        else:
            self.said[index].append(line)
            if self._echo:
                print(line, end="", flush=True)
        return index, at, line

    def expect(self, index: int, pattern: str, timeout: float, after: float = 0.0) -> str:
        """Returns the first line that peer index prints after the monotonic time ``after`` and that
        matches pattern, waiting at most timeout seconds."""
        deadline, what = time.monotonic() + timeout, f"line {pattern!r} from peer {index}"
        while True:
            i, at, line = self._next(deadline, what)
            if i != index:
                continue
            if line is None:
                status = self.procs[index].wait(10)
                raise RuntimeError(f"peer {index} ended (status {status}) before printing {pattern!r}")
            if at >= after and re.search(pattern, line):
                return line

    def wait_all(self, timeout: float) -> None:
        """Waits at most timeout seconds for every peer to end."""
        deadline = time.monotonic() + timeout
        while len(self._ended) < len(self.procs):
            self._next(deadline, "end of every peer")
        for p in self.procs.values():
            p.wait(max(1.0, deadline - time.monotonic()))

    def kill_running(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
