"""Serving on a unix domain socket (`vsurge serve --uds PATH`, as vLLM's `--uds`).

The path is checked before the model loads: a socket file a dead server left is removed, anything else at
PATH (a regular file, a folder, a socket a live server answers on) is refused. At shutdown the server
removes its socket file, so the next start finds the path free.
"""

from __future__ import annotations

import os
import socket
import stat

MAX_PATH_BYTES = 107  # Linux's sun_path holds 108 bytes, its terminating NUL included


def _answers(path: str) -> bool:
    """Whether a process listens on the socket file at `path` (a live server). ValueError when it cannot
    be told (no permission): such a file is not ours to remove."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(path)
        except ConnectionRefusedError:  # nobody listens: the server died
            return False
        except TimeoutError:  # a listener with a full backlog: alive
            return True
        except OSError as e:
            raise ValueError(f"--uds {path}: cannot tell whether a server listens on it ({e.strerror})") from None
    return True


def claim_socket_path(path: str) -> str:
    """The absolute path to serve on, made free: a stale socket file is removed. ValueError (naming the
    path) when the path cannot be served on."""
    path = os.path.abspath(os.path.expanduser(path))
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise ValueError(f"--uds {path}: a unix socket path holds at most {MAX_PATH_BYTES} bytes; choose a "
                         f"shorter one")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise ValueError(f"--uds {path}: the folder {folder} does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if not stat.S_ISSOCK(mode):
        raise ValueError(f"--uds {path} exists and is not a socket; remove it or choose another path")
    if _answers(path):
        raise ValueError(f"--uds {path}: another server is listening on this socket")
    os.unlink(path)  # a dead server's socket file
    return path


def release_socket_path(path: str) -> None:
    """Remove the socket file at shutdown (asyncio leaves it behind); anything that is not a socket stays."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
