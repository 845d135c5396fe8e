"""The paths a user gives the command line (a run folder, an output file), checked before any work,
and the names of a run folder's files.

Hand-written, not exported: a part of `runs.py` (the run folder), kept apart to keep each file short;
`runs` re-exports everything here.
"""
import os
import sys
import tempfile
from pathlib import Path

from transformer_lib.run_config import CONFIG, RunError, one_line
from transformer_lib.run_lock import LOCK, lock_holder

TOKENIZER, CHECKPOINT, HISTORY = "tokenizer.json", "checkpoint.pt", "history.json"
RUN_FILES = (CONFIG, TOKENIZER, CHECKPOINT, HISTORY, LOCK)


def _nearest_existing(path: Path) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            return folder
    return Path.cwd()


def check_path_text(path: Path, option: str) -> None:
    """RunError for a path holding bytes that are not UTF-8 (they reach Python as lone surrogates)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise RunError(f"{option} {os.fsencode(path)!r}: the path holds bytes that are not UTF-8; rename it, or "
                       "give a path without them") from None


def check_writable(path: Path, option: str, folder: bool) -> None:
    """RunError unless this process can create or replace `path` (a folder if `folder`, else a
    file): nothing in the way is a file (or, for a file, a folder), no link points nowhere, and the
    nearest existing folder accepts a new file, tried by writing and removing one there."""
    check_path_text(path, option)
    if path.is_symlink() and not path.exists():
        raise RunError(f"{option} {path} is a symbolic link to {os.readlink(path)}, which does not exist; create "
                       "that folder, or give another path" if folder else
                       f"{option} {path} is a symbolic link to {os.readlink(path)}, which does not exist; give "
                       "another path")
    if path.exists() and path.is_dir() != folder:
        kind = "a file, not a folder" if folder else "a folder, not a file"
        raise RunError(f"{option} {path} is {kind}; give a {'folder' if folder else 'file'} path")
    existing = _nearest_existing(path if folder else path.parent)     # a file is replaced from its folder
    if not existing.is_dir():
        raise RunError(f"{option} {path}: {existing} is a file, so nothing can be created inside it; "
                       "give a path under a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise RunError(f"{option} {path}: cannot write in {existing} ({error.strerror or one_line(error)}); "
                       "choose a folder you can write, or change its permissions") from None


def check_output_file(path: Path, option: str) -> None:
    """RunError, before any work, unless `path` can be written as an output file: not a link (which
    would be replaced), not read-only or immutable (tried by opening it for appending), not a run file."""
    check_writable(path, option, folder=False)
    if path.is_symlink():
        raise RunError(f"{option} {path} is a symbolic link (to {os.readlink(path)}), which would be replaced by a "
                       "file; give the path of the file itself")
    if path.exists():
        try:
            with open(path, "ab"):
                pass
        except OSError as error:
            raise RunError(f"{option} {path} cannot be replaced ({error.strerror or one_line(error)}); make it "
                           "writable or give another file") from None
    check_not_a_run_file(path, option)


def check_not_a_run_file(path: Path, option: str) -> None:
    """RunError when `path` (an output file) is one of the files of the run folder it lies in."""
    if path.name in RUN_FILES and (path.parent / CONFIG).is_file():
        raise RunError(f"{option} {path} would overwrite the {path.name} of the run in {path.parent}; "
                       "write the output to another file")


def check_readable_run(run: Path) -> None:
    """RunError unless `run` is a folder holding a run's config.json and checkpoint.pt as files."""
    check_path_text(run, "--run")
    if run.exists() and not run.is_dir():
        raise RunError(f"--run {run} is a file, not a run folder; give the folder that `train` wrote")
    for name in (CHECKPOINT, CONFIG):
        if (run / name).exists() and not (run / name).is_file():
            raise RunError(f"{run / name} is a folder, not the run's file; remove it and restore the file, or "
                           "train into a new --run folder")
        if not (run / name).is_file():
            holder = lock_holder(run)
            raise RunError(f"{run / name} is missing: " + (
                f"a train (pid {holder}) is writing {run} and has saved no checkpoint yet; wait for its first one"
                if holder else f"train first: python -m transformer_lib train --run {run} ..."))


def check_new_run_folder(run: Path) -> None:
    """A folder without config.json gets a new run only if it holds nothing but hidden files and the
    leftovers of a `train` killed before it began (*.tmp, the lock): a run is never written over
    other files, a tokenizer.json (another run's, or its own whose config.json is lost), or a
    checkpoint whose config.json is lost."""
    if run.is_dir():
        others = sorted(p.name for p in run.iterdir() if not (p.name.startswith(".") or p.name == LOCK
                                                              or p.name.endswith(".tmp")))
        if others:
            raise RunError(f"--run {run} is not a run folder (no {CONFIG}) and is not empty (it holds "
                           f"{', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); train into a new or "
                           "empty folder, or delete what is left of a damaged run")


def unreplaceable(path: Path) -> bool:
    """Whether Linux marks the file immutable or append-only (FS_IOC_GETFLAGS), which even root cannot replace."""
    if not sys.platform.startswith("linux") or not path.is_file() or path.is_symlink():
        return False
    import array
    import fcntl
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, 0x80086601, flags, True)      # FS_IOC_GETFLAGS
    except OSError:
        return False                                # a file system without these flags
    finally:
        os.close(fd)
    return bool(flags[0] & (0x10 | 0x20))           # FS_IMMUTABLE_FL, FS_APPEND_FL
