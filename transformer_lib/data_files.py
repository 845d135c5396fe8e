"""The files a data source names (`--data files:…`, `tsv:…`, `csv:…`, `--valid`, `--test`), checked
before a run takes its folder's lock: each is there and readable, is text rather than a folder of
parts, a workbook or zeros, and a named pipe has a process writing into it. Each refusal names the
fix a command-line user can apply.

Hand-written, not exported: the readers of notebook 10 read the files; this module is what the
command line (`train_run`, `evaluate --data`) checks first, so that a run never waits forever on a
pipe, nor takes its lock for data it cannot read.
"""
import contextlib
import csv
import difflib
import errno
import os
import re
import shlex
import stat
import threading
import zipfile
from pathlib import Path

FIFO_WAIT_S = 10.0          # how long a named pipe may wait for its writer before it is named
HEAD = 1 << 16              # the bytes looked at
COMPRESSED = (".gz", ".bz2", ".xz")
# Files that are not text, by their first bytes (zip-based ones by what they hold): what they are, and the fix.
_OFFICE = {"xl/workbook.xml": ("an Excel workbook (.xlsx)", "xlsx"),
           "content.xml": ("an OpenDocument file (.ods, .odt)", "ods"),
           "word/document.xml": ("a Word document (.docx)", "docx")}
_HEADER_WORDS = {"source", "target", "src", "tgt", "text", "sentence", "translation", "english", "german", "french",
                 "czech", "italian", "spanish", "input", "output", "original", "reference"}


def source_files(source) -> list[tuple[str, Path]]:
    """(option, path) of every file a `sources.DataSource` names: files, tsv and csv kinds."""
    if source.kind not in ("files", "tsv", "csv"):
        return []
    found = []
    for split, option in (("train", "--data"), ("valid", "--valid"), ("test", "--test")):
        where = getattr(source, split)
        for path in ((where,) if isinstance(where, str) else where or ()):
            found.append((option, Path(path)))
    return found


class CheckedFiles(contextlib.ExitStack):
    """The files of a source, checked; `source` is what to read: the same, but a pipe (named or `<(...)`)
    is read through the read end opened while checking it, relayed by a thread into an anonymous pipe
    (`/dev/fd/N`), because opening a named pipe again waits for a writer that may be gone by then.
    `names` maps such a relay's path back to the user's, for messages. Close it once the data is read."""

    def __init__(self, source):
        super().__init__()
        self.source, self.names = source, {}

    def relay(self, fd: int, path: Path) -> str:
        read_end, write_end = os.pipe()

        def pump():
            try:
                while chunk := os.read(fd, 1 << 16):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(write_end, view):]
            except OSError:
                pass                    # the reader stopped early (an error in the data): nothing more to relay
            finally:
                os.close(write_end)
                os.close(fd)
        threading.Thread(target=pump, daemon=True).start()
        self.callback(os.close, read_end)
        self.names[f"/dev/fd/{read_end}"] = str(path)
        return f"/dev/fd/{read_end}"

    def user_names(self, error: BaseException) -> BaseException:
        """`error` with the relays' paths written as the user's; the same exception type."""
        text = str(error)
        for relay, path in self.names.items():
            text = text.replace(relay, path)
        return type(error)(text) if text != str(error) else error


def check_source_files(source, wait_s: float | None = None) -> CheckedFiles:
    """ValueError or FileNotFoundError naming the first file of `source` that cannot be read, with its fix;
    else a `CheckedFiles` whose `source` is what to read (keep it open while reading). A named pipe that no
    process opens for writing in `wait_s` seconds (`FIFO_WAIT_S`) is refused."""
    import dataclasses
    held, moved = CheckedFiles(source), {}
    try:
        for option, path in source_files(source):
            mode = _mode(path)
            if stat.S_ISFIFO(mode):
                moved[str(path)] = held.relay(_open_pipe(path, FIFO_WAIT_S if wait_s is None else wait_s), path)
            elif stat.S_ISREG(mode):
                _check_head(path, source)
    except BaseException:
        held.close()
        raise
    if moved:
        swap = lambda where: where if where is None else (  # noqa: E731
            moved.get(where, where) if isinstance(where, str) else tuple(moved.get(p, p) for p in where))
        held.source = dataclasses.replace(source, **{split: swap(getattr(source, split))
                                                     for split in ("train", "valid", "test")})
    return held


def header_warning(source) -> str | None:
    """A warning when a tsv or csv file read without --header starts with a row that looks like one."""
    if source.kind not in ("tsv", "csv") or source.header:
        return None
    path = Path(source.train)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as f:
            first = f.read(HEAD).split(b"\n", 1)[0].decode("utf-8-sig", "replace").rstrip("\r")
    except OSError:
        return None
    delimiter = "\t" if source.kind == "tsv" else source.delimiter or ","
    row = next(csv.reader([first], delimiter=delimiter), [])
    langs = {source.src_lang, source.tgt_lang} - {None}
    if len(row) < 2 or not all(_looks_like_a_name(field, langs) for field in row):
        return None
    return (f"line 1 of {path} ({', '.join(map(repr, row[:4]))}) looks like a header naming the columns, and is "
            "trained on as a pair; if it is a header, add --header")


def _looks_like_a_name(field: str, langs: set) -> bool:
    field = field.strip()
    return (field in langs or field.lower() in _HEADER_WORDS
            or re.fullmatch(r"[a-z]{2,3}([-_][A-Za-z]{2,4})?", field) is not None)


def _mode(path: Path) -> int:
    """The file's mode; FileNotFoundError or ValueError with the fix when it is missing, a folder, unreadable."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if error.errno == errno.EACCES:
            raise ValueError(_unreadable(path)) from None
        if error.errno not in (errno.ENOENT, errno.ENOTDIR):
            return 0                                     # a link loop and the like: the reader names them
        if os.path.islink(path):
            raise FileNotFoundError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist; point "
                                    f"it at the real file (`ln -sfn REAL_FILE {shlex.quote(str(path))}`), or give "
                                    "the real file") from None
        raise FileNotFoundError(_missing(path)) from None
    if stat.S_ISDIR(mode):
        raise ValueError(_folder(path))
    return mode


def _missing(path: Path) -> str:
    folder = path.parent
    if not folder.is_dir():
        return f"{path}: no such file (there is no folder {folder})"
    try:
        names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    except OSError:
        names = []
    close = [n for n in names if n in {path.name + c for c in COMPRESSED}]
    close += [n for n in difflib.get_close_matches(path.name, names, n=3, cutoff=0.6) if n not in close]
    if close:
        return f"{path}: no such file; did you mean {' or '.join(str(folder / n) for n in close[:3])}?"
    return f"{path}: no such file" + (f" ({folder} holds {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                                      if names else f" ({folder} is empty)")


def _folder(path: Path) -> str:
    try:
        names = sorted(p.name for p in path.iterdir() if not p.name.startswith((".", "_")))
    except OSError:
        names = []
    parts = [n for n in names if n.startswith("part-")]
    quoted = shlex.quote(str(path))
    if parts:
        return (f"{path} is a folder of {len(parts)} part files ({parts[0]}, ...), as Spark or Hadoop write them; "
                f"join them into one file first, e.g. `cat {quoted}/part-* > {quoted}.txt` (gzip parts join the same "
                "way; CSV parts with a header each: `awk 'FNR>1 || NR==1' ...`), then give that file")
    return (f"{path} is a folder, not a file; give a file in it"
            + (f" (it holds {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})" if names else " (it is empty)"))


def _unreadable(path: Path) -> str:
    return (f"{path}: permission denied, this user may not read it; make it readable (`chmod u+r "
            f"{shlex.quote(str(path))}`, or ask its owner) or copy it where you can read it")


def _check_head(path: Path, source) -> None:
    """ValueError for a regular file that is unreadable, all NUL bytes, or an office file, with its fix."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD)
    except PermissionError:
        raise ValueError(_unreadable(path)) from None
    except OSError:
        return                                           # the reader names what else goes wrong
    if head and not head.strip(b"\0"):
        raise ValueError(f"{path} holds only NUL bytes (zeros) in its first {len(head):,} bytes, no text: an "
                         "unfinished or failed download or copy; download or copy it again")
    if head.startswith(b"\xd0\xcf\x11\xe0"):
        raise ValueError(f"{path} is an old Office file (.xls, .doc), not text; " + _save_as(path, "xls"))
    if head.startswith(b"%PDF"):
        raise ValueError(f"{path} is a PDF, not text; extract its text first (`pdftotext {shlex.quote(str(path))}`) "
                         "and align the sentences, one per line")
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:
                inside = set(archive.namelist())
        except (zipfile.BadZipFile, OSError):
            return
        for member, (what, kind) in _OFFICE.items():
            if member in inside:
                raise ValueError(f"{path} is {what}, not text; " + _save_as(path, kind))


def _save_as(path: Path, kind: str) -> str:
    quoted = shlex.quote(str(path))
    if kind == "docx":
        return f"save it as plain text (UTF-8, one sentence a line), e.g. `libreoffice --headless --convert-to txt {quoted}`"
    return (f"save the sheet as CSV (Save As > CSV UTF-8, or `libreoffice --headless --convert-to csv {quoted}`), then "
            f"give --data csv:{Path(path).with_suffix('.csv')} (with --header if its first row names the columns)")


def _open_pipe(path: Path, wait_s: float) -> int:
    """A read end of the named pipe `path`, once a process has it open for writing; ValueError after
    `wait_s` seconds without one (the open is then released by opening the pipe for writing ourselves)."""
    opened, failed = [], []

    def open_it():
        try:
            opened.append(os.open(path, os.O_RDONLY))
        except OSError as error:
            failed.append(error)
    thread = threading.Thread(target=open_it, daemon=True)
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))     # wakes the waiting open
        thread.join(1.0)
        for fd in opened:
            os.close(fd)
        raise ValueError(f"{path} is a named pipe (FIFO) that no process opened for writing in {wait_s:g} s; start "
                         f"its writer first (e.g. `zcat FILE.gz > {shlex.quote(str(path))} &`), or give the file "
                         "itself: compressed files (.gz, .bz2, .xz) are read directly, and `<(command)` streams one")
    if failed:
        if failed[0].errno == errno.EACCES:
            raise ValueError(_unreadable(path))
        raise failed[0]
    return opened[0]


def read_checked(source):
    """`sources.read_source(source)` after `check_source_files`: what `evaluate` reads."""
    from transformer_lib.sources import read_source
    with check_source_files(source) as files:
        try:
            return read_source(files.source)
        except (ValueError, OSError) as error:
            raise files.user_names(error) from None
