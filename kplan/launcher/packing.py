"""The code packer: what of the training script's folder goes to the job's bucket.

A cloud job ships the script's folder as ``<job>/code/job.tar.gz``. Only code goes:

- ``.gitignore`` and ``.kplanignore`` files (the folder's own and nested ones, and inside a git
  work tree those of the folders above it up to its top, as git does; same syntax) are honoured
  with git's pattern rules: ``#`` comments, ``!`` negation, ``*`` / ``?`` / ``[...]`` within one
  path segment, ``**`` across segments, a leading or inner ``/`` anchors the pattern
  to the ignore file's folder, a trailing ``/`` matches directories only. The last matching rule
  wins; a deeper file's rules come after its parents', ``.kplanignore`` after ``.gitignore``.
  As in git, nothing inside an ignored directory can be re-included.
- Credential and secret files are always left out, whatever the ignore files say (see
  :func:`is_secret`), and so is any file that holds a PEM private key; the result names them.
- VCS folders, virtualenvs and caches are always left out.
- Symbolic links are never followed: one that points inside the folder is stored as a link, one
  that points outside is left out (and named).
- A home directory or ``/`` is never packed; the archive is capped in bytes and files.

Packing reads files and builds the archive in memory; it writes nothing and sends nothing.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import stat
import tarfile
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from kplan.core.errors import InputError

CODE_LIMIT_BYTES = 200 * 1024 * 1024  # the files' own bytes, before compression
CODE_LIMIT_FILES = 10_000
IGNORE_FILES = (".gitignore", ".kplanignore")  # in this order: .kplanignore's rules win
_IGNORE_FILE_LIMIT = 1024 * 1024
_SNIFF_BYTES = 8192  # a PEM private key's header sits at the start of the file

# Always left out, never reported: version control, virtualenvs, caches, kplan's own state.
NOISE_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache",
        ".pytest_cache", ".ruff_cache", ".tox", ".ipynb_checkpoints", ".kplan",
    }
)  # fmt: skip
NOISE_SUFFIXES = (".pyc", ".pyo")

# Always left out and reported: credentials and secrets (file or directory names, any depth).
SECRET_NAMES = frozenset(
    {".aws", ".ssh", ".gnupg", ".kube", ".netrc", ".pypirc", ".git-credentials", ".pgpass"}
)
SECRET_GLOBS = (".env", ".env*", "*.pem", "*.key", "*.p12", "*.pfx", "credentials*")
SECRET_PATHS = ((".docker", "config.json"), (".config", "gcloud"))
_CODE_SUFFIXES = (".py", ".pyi")  # ``id_map.py`` is code; ``id_rsa``, ``id_ed25519.pub`` are not
_KEY_MARKER = b"PRIVATE KEY-----"


@dataclass(frozen=True)
class PackedCode:
    """The archive and what went into it (paths relative to ``folder``, POSIX separators)."""

    data: bytes  # the tar.gz
    folder: str
    files: tuple[tuple[str, int], ...]  # (path, bytes), sorted; links count 0 bytes
    total_bytes: int  # the files' own bytes
    skipped_secrets: tuple[str, ...]  # secret-looking files and folders left out (folders end /)
    skipped_links: tuple[str, ...]  # symbolic links pointing outside the folder
    ignored: int  # files and folders left out by .gitignore / .kplanignore rules

    @property
    def archive_bytes(self) -> int:
        return len(self.data)

    def to_dict(self, files: int | None = None) -> dict[str, object]:
        """JSON-ready; ``files`` limits how many paths are listed (None: all)."""
        listed = self.files if files is None else self.files[:files]
        return {
            "folder": self.folder,
            "file_count": len(self.files),
            "total_bytes": self.total_bytes,
            "archive_bytes": self.archive_bytes,
            "files": [{"path": p, "bytes": n} for p, n in listed],
            "skipped_secrets": list(self.skipped_secrets),
            "skipped_links": list(self.skipped_links),
            "ignored": self.ignored,
        }


# --- ignore files --------------------------------------------------------------------------


_ANY_ONE = re.compile(r"(?s:.+)\Z")  # a trailing "/**": one part or more, so one, then "**"


@dataclass(frozen=True)
class IgnoreRule:
    """One pattern line of an ignore file in the folder ``base`` (path parts from the root)."""

    pattern: str  # as written
    base: tuple[str, ...]
    segments: tuple[str, ...]  # fnmatch patterns, one per path segment, or "**"
    negate: bool
    dir_only: bool
    compiled: tuple[re.Pattern[str] | None, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled", _compile(self.segments))

    def matches(self, parts: tuple[str, ...], is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        n = len(self.base)
        if len(parts) <= n or parts[:n] != self.base:
            return False
        return _match(self.compiled, parts[n:])


def _compile(segments: tuple[str, ...]) -> tuple[re.Pattern[str] | None, ...]:
    """Each segment as a compiled regular expression once (None for ``**``: any number of
    parts, none included); a trailing ``**`` (everything inside, not the folder itself) becomes
    one part of anything, then ``**``."""
    out: list[re.Pattern[str] | None] = [
        None if s == "**" else re.compile(fnmatch.translate(s)) for s in segments
    ]
    if segments and segments[-1] == "**":
        out[-1:] = [_ANY_ONE, None]
    return tuple(out)


def _match(segments: tuple[re.Pattern[str] | None, ...], parts: tuple[str, ...]) -> bool:
    """Whether ``parts`` match ``segments``, as a set of positions in the pattern advanced one
    part at a time (a Thompson simulation): O(parts x segments) whatever the ``**`` count, where
    trying each split of the path for each ``**`` in turn is exponential in their number."""
    end = len(segments)

    def closure(states: set[int]) -> set[int]:
        todo = list(states)
        while todo:  # a "**" may match no part: the position after it is reached too
            j = todo.pop()
            if j < end and segments[j] is None and j + 1 not in states:
                states.add(j + 1)
                todo.append(j + 1)
        return states

    states = closure({0})
    for part in parts:
        step: set[int] = set()
        for j in states:
            if j == end:
                continue
            pattern = segments[j]
            if pattern is None:
                step.add(j)  # "**" takes this part and may take more
            elif pattern.match(part):
                step.add(j + 1)
        if not step:
            return False
        states = closure(step)
    return end in states


def _unescape(segment: str) -> str:
    r"""git's ``\x`` (a literal x) in fnmatch terms: ``[x]`` for a wildcard character."""
    if "\\" not in segment:
        return segment
    out, i = [], 0
    while i < len(segment):
        c = segment[i]
        if c == "\\" and i + 1 < len(segment):
            nxt = segment[i + 1]
            out.append(f"[{nxt}]" if nxt in "*?[" else nxt)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_ignore(text: str, base: tuple[str, ...] = ()) -> list[IgnoreRule]:
    """The rules of one ignore file in the folder ``base`` (gitignore syntax)."""
    rules = []
    for raw in text.splitlines():
        line = raw
        while line.endswith(" ") and not line.endswith("\\ "):
            line = line[:-1]  # trailing spaces are ignored unless escaped
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line  # a leading or inner slash: relative to the ignore file's folder
        segs = [s for s in line.lstrip("/").split("/") if s]
        if not segs:
            continue
        collapsed: list[str] = []
        for s in segs:
            if not (s == "**" and collapsed and collapsed[-1] == "**"):
                collapsed.append(s)
        segments = tuple(s if s == "**" else _unescape(s) for s in collapsed)
        if not anchored:
            segments = ("**", *segments)
        rules.append(IgnoreRule(raw.strip(), base, segments, negate, dir_only))
    return rules


def is_ignored(rules: list[IgnoreRule], parts: tuple[str, ...], is_dir: bool) -> bool:
    """The last rule that matches decides; none matching: not ignored."""
    for rule in reversed(rules):
        if rule.matches(parts, is_dir):
            return not rule.negate
    return False


def _read_ignore(path: Path) -> str:
    try:
        st = path.lstat()
    except OSError:
        return ""
    if not stat.S_ISREG(st.st_mode) or st.st_size > _IGNORE_FILE_LIMIT:
        return ""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


# --- what is always left out ---------------------------------------------------------------


def is_secret(parts: tuple[str, ...]) -> bool:
    """A credential or secret by its name (``parts``: the path from the packed folder)."""
    lowered = tuple(part.lower() for part in parts)  # case-insensitive file systems too
    low = lowered[-1]
    if low in SECRET_NAMES or any(fnmatchcase(low, g) for g in SECRET_GLOBS):
        return True
    if low.startswith("id_") and not low.endswith(_CODE_SUFFIXES):
        return True
    return any(lowered[-len(p) :] == p for p in SECRET_PATHS if len(lowered) >= len(p))


def _is_noise(name: str, is_dir: bool) -> bool:
    return name in NOISE_DIRS if is_dir else name.endswith(NOISE_SUFFIXES)


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (RuntimeError, KeyError, OSError):
        return None


def code_folder(script: Path) -> Path:
    """The folder that ships with ``script``; never a home directory, an ancestor of one, or /."""
    try:
        is_file = script.is_file()
    except OSError:
        is_file = False
    if not is_file:
        raise InputError(f"training script not found: {script}", hint="check the path")
    folder = script.resolve().parent
    home = _home()
    root = folder == Path(folder.anchor)
    if root or (home is not None and (folder == home or folder in home.parents)):
        raise InputError(
            f"will not pack {folder} ({'/' if root else 'a home directory'}) to ship "
            f"{script.name}: it would upload everything in it",
            hint="put the training script and its code in a folder of their own",
        )
    return folder


# --- the packer ----------------------------------------------------------------------------


def _repo_top(folder: Path) -> Path:
    """The top of the git work tree holding ``folder`` (``folder`` itself when there is none)."""
    home = _home()
    for d in (folder, *folder.parents):
        if (d / ".git").exists():
            return d
        if d == home:
            break
    return folder


class _Packer:
    def __init__(self, folder: Path, script: Path, limit_bytes: int, limit_files: int) -> None:
        self.folder = folder
        self.script = script
        self.limit_bytes = limit_bytes
        self.limit_files = limit_files
        self.files: list[tuple[str, int]] = []
        self.total = 0
        self.secrets: list[str] = []
        self.links: list[str] = []
        self.ignored = 0
        # Inside a git work tree the ignore files of the folders above apply too, as in git:
        # rules and paths are then relative to the work tree's top.
        top = _repo_top(folder)
        self.prefix = folder.relative_to(top).parts

    def _ancestor_rules(self) -> list[IgnoreRule]:
        rules: list[IgnoreRule] = []
        for i in range(len(self.prefix)):
            here = self.folder.parents[len(self.prefix) - 1 - i]
            for name in IGNORE_FILES:
                rules += parse_ignore(_read_ignore(here / name), self.prefix[:i])
        return rules

    def _too_big(self, what: str) -> InputError:
        return InputError(
            f"{self.folder} holds more than {what} of code to ship",
            hint="list data, outputs and checkpoints in a .kplanignore (gitignore syntax), or "
            "put the training script in its own folder; data goes in a bucket",
        )

    def pack(self) -> PackedCode:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
            stack: list[tuple[tuple[str, ...], list[IgnoreRule]]] = [((), self._ancestor_rules())]
            while stack:
                rel, inherited = stack.pop()
                here = self.folder.joinpath(*rel)
                rules = list(inherited)
                for name in IGNORE_FILES:
                    rules += parse_ignore(_read_ignore(here / name), self.prefix + rel)
                try:
                    entries = sorted(os.scandir(here), key=lambda e: e.name, reverse=True)
                except OSError as err:
                    raise InputError(
                        f"cannot read {here}: {err.strerror}", hint="check its permissions"
                    ) from err
                for entry in entries:
                    self._entry(tar, entry, (*rel, entry.name), rules, stack)
            self._script(tar)
        self.files.sort()
        return PackedCode(
            data=buf.getvalue(),
            folder=str(self.folder),
            files=tuple(self.files),
            total_bytes=self.total,
            skipped_secrets=tuple(sorted(self.secrets)),
            skipped_links=tuple(sorted(self.links)),
            ignored=self.ignored,
        )

    def _entry(
        self,
        tar: tarfile.TarFile,
        entry: os.DirEntry[str],
        parts: tuple[str, ...],
        rules: list[IgnoreRule],
        stack: list[tuple[tuple[str, ...], list[IgnoreRule]]],
    ) -> None:
        rel = "/".join(parts)
        try:
            is_link = entry.is_symlink()
            is_dir = os.path.isdir(entry.path) if is_link else entry.is_dir(follow_symlinks=False)
        except OSError:
            return
        if is_secret(parts):
            self.secrets.append(rel + ("/" if is_dir else ""))
            return
        if _is_noise(entry.name, is_dir):
            return
        is_script = parts == (self.script.name,)
        if not is_script and is_ignored(rules, self.prefix + parts, is_dir):
            self.ignored += 1
            return
        if is_link:
            self._link(tar, entry, rel)
        elif is_dir:
            stack.append((parts, rules))
        else:
            self._file(tar, Path(entry.path), rel)

    def _link(self, tar: tarfile.TarFile, entry: os.DirEntry[str], rel: str) -> None:
        """A link inside the folder is stored as a link; one pointing outside is left out."""
        target = Path(os.path.realpath(entry.path))
        if target != self.folder and self.folder not in target.parents:
            self.links.append(rel)
            return
        if is_secret(target.relative_to(self.folder).parts or ("",)):
            self.secrets.append(rel)
            return
        info = tarfile.TarInfo(rel)
        info.type = tarfile.SYMTYPE
        info.linkname = os.path.relpath(target, Path(entry.path).parent)
        info.mode = 0o777
        self._count(rel, 0)
        tar.addfile(info)

    def _count(self, rel: str, size: int) -> None:
        if len(self.files) >= self.limit_files:
            raise self._too_big(f"{self.limit_files:,} files")
        if self.total + size > self.limit_bytes:
            raise self._too_big(f"{self.limit_bytes // 2**20} MiB")
        self.files.append((rel, size))
        self.total += size

    def _file(self, tar: tarfile.TarFile, path: Path, rel: str) -> None:
        """A regular file, opened without following a link and without blocking on a FIFO."""
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(path, flags)
        except OSError:
            return  # vanished, unreadable, or replaced by a link since the listing
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return  # a FIFO, socket or device: not code
            head = fh.read(_SNIFF_BYTES)
            if _KEY_MARKER in head:
                self.secrets.append(rel)
                return
            fh.seek(0)
            self._count(rel, st.st_size)
            info = tarfile.TarInfo(rel)
            info.size = st.st_size
            info.mtime = int(st.st_mtime)
            info.mode = stat.S_IMODE(st.st_mode) & 0o755
            tar.addfile(info, fh)

    def _script(self, tar: tarfile.TarFile) -> None:
        """The script under the name the node runs (``Path(script).name``), whatever happened."""
        name = self.script.name
        if any(rel == name for rel, _ in self.files):
            return
        if name in self.secrets:
            raise InputError(
                f"the training script {self.script} looks like a secret file; it is not shipped",
                hint="rename it (names like credentials*, .env*, *.key, id_* are never uploaded)",
            )
        self._file(tar, self.script.resolve(), name)
        if name in self.secrets:
            raise InputError(
                f"the training script {self.script} holds a private key; it is not shipped",
                hint="keep keys out of the code: nodes get their access from their own role",
            )


def pack_code(
    script: Path,
    *,
    limit_bytes: int = CODE_LIMIT_BYTES,
    limit_files: int = CODE_LIMIT_FILES,
) -> PackedCode:
    """The script's folder as a tar.gz of code only (see the module's docstring)."""
    folder = code_folder(script)
    return _Packer(folder, script, limit_bytes, limit_files).pack()
