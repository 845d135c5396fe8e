"""Files written whole, and fingerprints of what they hold: the two things every layer that writes
a run's files needs (the run folder, checkpoints, figures, attention maps), so they live at the
bottom of the package and import nothing of it.

Hand-written, not exported: no one notebook is their home.
"""
import hashlib
import json
import os
from pathlib import Path


def write_atomic(path: str | os.PathLike, write) -> None:
    """`write(temporary path)`, flushed to disk, then renamed onto `path`: readers see the old file
    or the new one, never half of one. The temporary file is created new (O_EXCL, after removing a
    leftover of a killed process), so no link is followed; it is removed on error."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic_in(folder_fd: int | None, path: str | os.PathLike, write) -> None:
    """`write(binary file)` into a new temporary file beside `path`, flushed to disk, then renamed onto
    `path`. With `folder_fd` (an open folder, `os.open(folder, os.O_RDONLY | os.O_DIRECTORY)`), `path`
    is the file's name in that folder, found through the open folder and not through its path: a folder
    renamed or moved meanwhile is written where it now is, and nothing is created where it was."""
    if folder_fd is None:      # Windows, which has no dir_fd: by path (the callers pass None there)
        path = Path(path)
        write_atomic(path, lambda tmp: _write_to(tmp, write))
        return
    name = os.fspath(path)
    tmp, at = name + ".tmp", {"dir_fd": folder_fd}
    _unlink_at(tmp, folder_fd)
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, **at), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        _unlink_at(tmp, folder_fd)
        raise


def _write_to(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)


def _unlink_at(name: str, folder_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass


def fingerprint_pairs(pairs: list[tuple[str, str]]) -> dict:
    """SHA-256 of (source, target) pairs in order, and their count: equal for the same training data,
    whatever file, compression or line endings it came from."""
    digest = hashlib.sha256()
    for src, tgt in pairs:
        digest.update(src.encode("utf-8", "surrogatepass") + b"\0" + tgt.encode("utf-8", "surrogatepass") + b"\n")
    return {"sha256": digest.hexdigest(), "count": len(pairs)}


def write_json(path: Path, value) -> None:
    """JSON, atomically; ValueError for NaN or infinity, which JSON cannot hold."""
    text = json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)
    write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))



def fingerprint_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fingerprint_tokenizer(text: str) -> str:
    """SHA-256 of what a tokenizer.json encodes (its JSON with sorted keys, no spacing), so that a
    re-indented file keeps its fingerprint and a changed merge or token does not."""
    return fingerprint_bytes(json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"),
                                        ensure_ascii=False).encode("utf-8"))
