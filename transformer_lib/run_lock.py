"""One writer at a time for a run folder: `TrainLock`, and `lock_holder` for messages.

Hand-written, a part of `runs.py` kept apart. The lock is `flock` on the run folder itself (opened
with O_DIRECTORY), which the system releases when its process ends, however it ends; train.lock
only tells others the holder's process id. So a symbolic link named train.lock is never followed
(the file is replaced by a rename), and deleting train.lock does not free the folder.
"""
import os
from pathlib import Path

from transformer_lib.files import write_atomic_in
from transformer_lib.run_config import RunError

LOCK = "train.lock"


def _try_lock(fd: int) -> bool:
    """Take an exclusive lock on the open file or folder `fd` without waiting."""
    try:
        if os.name == "nt":
            import msvcrt
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def _open_target(run: Path) -> int:
    """What the lock is taken on: the folder itself (POSIX), or a lock file beside the pid (Windows,
    which cannot lock a folder)."""
    if os.name == "nt":
        return os.open(run / (LOCK + ".nt"), os.O_RDWR | os.O_CREAT, 0o644)
    return os.open(run, os.O_RDONLY | os.O_DIRECTORY)


def _read_pid(run: Path, folder_fd: int | None = None) -> str:
    """The pid in train.lock (read through the open folder `folder_fd` when given), or "unknown"."""
    at = {"dir_fd": folder_fd} if folder_fd is not None else {}
    try:
        fd = os.open(LOCK if at else run / LOCK, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), **at)
    except OSError:
        return "unknown"
    try:
        return os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
    finally:
        os.close(fd)


def lock_holder(run: Path) -> str | None:
    """The pid in train.lock if a live `train` holds the lock of `run`, else None."""
    try:
        fd = _open_target(Path(run))
    except OSError:
        return None
    try:
        return None if _try_lock(fd) else _read_pid(Path(run))    # closing the folder releases a lock taken here
    finally:
        os.close(fd)


def _write_pid(run: Path, folder_fd: int) -> None:
    """This process's id into train.lock, by renaming a new file onto it: a link there is replaced, not followed."""
    write_atomic_in(folder_fd if os.name != "nt" else None, LOCK if os.name != "nt" else run / LOCK,
                    lambda f: f.write(str(os.getpid()).encode("ascii")))


class TrainLock:
    """An exclusive lock on a run folder for one `train`: a second one is refused with the holder's
    pid. Creates the folder if needed; on exit removes train.lock, and the folders it created if
    they are still empty (a refused train leaves nothing behind). `fd` is the open folder (POSIX):
    the run folder writes through it, so a folder moved while it is locked is written where it is."""

    def __init__(self, run: Path):
        self.run, self.path, self.fd, self.created = Path(run), Path(run) / LOCK, None, []

    def __enter__(self) -> "TrainLock":
        for folder in reversed([self.run, *self.run.parents]):
            if not folder.exists():
                folder.mkdir()
                self.created.append(folder)
        try:
            fd = _open_target(self.run)
            if not _try_lock(fd):
                os.close(fd)
                raise RunError(f"another train (pid {_read_pid(self.run)}) is writing {self.run}, so it is left to "
                               "that one; wait for it to end (or stop it), or train into another --run folder")
            self.fd = fd
            _write_pid(self.run, fd)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            try:
                if _read_pid(self.run, self.fd) == str(os.getpid()):     # through the folder, wherever it is now
                    if os.name == "nt":
                        self.path.unlink()
                    else:
                        os.unlink(LOCK, dir_fd=self.fd)    # before unlocking: a waiter then finds no stale pid
            except OSError:
                pass                         # a folder made read-only: the pid stays, the lock goes
            os.close(self.fd)
            self.fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in reversed(self.created):
            try:
                folder.rmdir()      # only if empty: a run that wrote files keeps them
            except OSError:
                break
        self.created = []
