"""The lifeline guard: kills every registered process group when llamaswap dies.

Run as a separate tiny interpreter (``python -I -S _guard.py``) with a pipe from
llamaswap on stdin. Lines ``+PGID`` register a model's process group, ``-PGID`` forget
it. When the pipe reaches end of file, every write end is closed: llamaswap has exited
(however it died, even by ``kill -9``), so the guard SIGKILLs every group still
registered and exits. It imports nothing from llamaswap, so it starts in milliseconds.

If the guard itself dies, llamaswap starts another on a new pipe and writes every live
group into it first (``lifeline.py``); this one never needs to know.
"""

import contextlib
import os
import signal


def main() -> None:
    # Terminal and service-manager signals are for llamaswap: it stops the models
    # politely, then closes the pipe.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    pending = b""
    while chunk := os.read(0, 4096):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b"+"):
                groups.add(int(line[1:]))
            elif line.startswith(b"-"):
                groups.discard(int(line[1:]))
    for group in groups:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)


if __name__ == "__main__":
    main()
