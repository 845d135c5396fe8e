"""Files written whole, and fingerprints of what they hold: the two things every layer that writes
a run's files needs (the run folder, checkpoints, figures, attention maps), so they live at the
bottom of the package and import nothing of it.

Hand-written, not exported: no one notebook is their home.
"""
import hashlib
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


def fingerprint_pairs(pairs: list[tuple[str, str]]) -> dict:
    """SHA-256 of (source, target) pairs in order, and their count: equal for the same training data,
    whatever file, compression or line endings it came from."""
    digest = hashlib.sha256()
    for src, tgt in pairs:
        digest.update(src.encode("utf-8", "surrogatepass") + b"\0" + tgt.encode("utf-8", "surrogatepass") + b"\n")
    return {"sha256": digest.hexdigest(), "count": len(pairs)}
