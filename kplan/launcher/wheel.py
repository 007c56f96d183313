"""The kplan that nodes install: a wheel of the running kplan, shipped through the job's bucket.

kplan is on no package index, and a package of that name on one would be someone else's code
running on the user's nodes: so a node never runs ``pip install kplan``. The launcher builds a
wheel of its own kplan from its source tree (setuptools, ``pip wheel --no-deps
--no-build-isolation --no-index`` in a temporary copy, so the source tree is never written) or,
installed from a wheel without a source tree, packs its installed files again. The wheel is
cached under ``$KPLAN_HOME/wheels/<version>-<source hash>/`` (a changed source rebuilds, an
unchanged one is reused), uploaded to ``<job>/code/<wheel name>`` next to the packed code, and
the bootstrap installs it from there after checking its sha256.

The dependencies nodes need (torch and kplan's own) come from the node's package index, pinned
to the versions the launcher runs (:func:`node_requirements`), or from the image
(``JobSpec.install_deps`` False: the wheel is installed with ``--no-deps``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kplan import __version__
from kplan.core.errors import CloudError, InputError

WHEEL_DIR = "wheels"
BUILD_TIMEOUT_S = 300.0
# Copied into the temporary build tree (and hashed): what setuptools reads to build the wheel.
_TOP_FILES = ("pyproject.toml", "README.md", "LICENSE")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".mypy_cache")
# Distributions a node needs besides kplan itself (kplan's [torch] extra).
_NODE_EXTRAS = ("torch",)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class NodeWheel:
    """A built wheel on the launcher's machine."""

    path: Path
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return self.path.name


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def source_tree() -> Path | None:
    """The source tree of the running kplan (the folder holding its ``pyproject.toml``), or
    None when kplan runs from an installed wheel (then :func:`build_wheel` packs the installed
    files again)."""
    import kplan

    root = Path(kplan.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if re.search(r'(?m)^name\s*=\s*"kplan"\s*$', text) else None


def _copy_tree(source: Path, dest: Path) -> None:
    """The files the build reads."""
    shutil.copytree(source / "kplan", dest / "kplan", ignore=_IGNORE)
    for name in _TOP_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)


def tree_hash(root: Path) -> str:
    """sha256 over every file's relative path and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_wheel(
    home: Path | None = None, source: Path | None = None, timeout_s: float = BUILD_TIMEOUT_S
) -> NodeWheel:
    """The wheel of the running kplan (or of ``source``), built now or reused from the cache.

    From a source tree (a checkout, or an editable install): setuptools builds it. Without one
    (kplan installed from a wheel): the installed files are packed again as that wheel.
    Raises :class:`CloudError` (one line and a hint) when neither is there, or the build fails
    or takes longer than ``timeout_s``."""
    if source is None:
        source = source_tree()
    if home is None:
        from kplan.core.paths import kplan_home

        home = kplan_home()
    with tempfile.TemporaryDirectory(prefix="kplan-wheel-") as tmp:
        src = Path(tmp) / "src"
        try:
            if source is not None:
                _copy_tree(source, src)
            elif not _copy_installed(src):
                raise CloudError(
                    "cannot ship this kplan to the nodes: found neither its source tree nor "
                    "its installed files",
                    hint="install kplan with pip (pip install -e /path/to/kplan, or its wheel)",
                )
        except OSError as err:
            raise CloudError(
                f"cannot read kplan's files ({source or 'installed'}): {err}",
                hint="check that the kplan installation is complete and readable",
            ) from None
        key = f"{__version__}-{tree_hash(src)[:16]}"
        cache = home / WHEEL_DIR / key
        cached = sorted(cache.glob("kplan-*.whl")) if cache.is_dir() else []
        if cached:
            return _described(cached[0])
        out = Path(tmp) / "out"
        if source is not None:
            _run_build(src, out, timeout_s)
        else:
            _zip_wheel(src, out)
        built = sorted(out.glob("kplan-*.whl"))
        if len(built) != 1:
            raise CloudError(
                f"building kplan's wheel gave {len(built)} wheels in {out}",
                hint="check kplan's pyproject.toml",
            )
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        final = cache / built[0].name
        staged = cache / f".{built[0].name}.{os.getpid()}.tmp"
        shutil.copyfile(built[0], staged)
        staged.replace(final)  # atomic: a concurrent launch sees a whole wheel or none
        return _described(final)


# An installed wheel's own metadata files that describe kplan (not this machine's install).
_DIST_INFO_KEEP = ("METADATA", "entry_points.txt", "top_level.txt")


def _copy_installed(dest: Path) -> bool:
    """Copy the installed kplan as a wheel holds it: its ``kplan/`` files (no bytecode) and the
    metadata of its dist-info. False when kplan is not installed that way (no files listed)."""
    try:
        dist = importlib.metadata.distribution("kplan")
    except importlib.metadata.PackageNotFoundError:
        return False
    files = [f for f in dist.files or () if f.parts and f.parts[0] == "kplan"]
    files = [f for f in files if "__pycache__" not in f.parts and f.suffix not in (".pyc", ".pyo")]
    if not any(f.name == "__init__.py" and len(f.parts) == 2 for f in files):
        return False
    for f in files:
        target = dest / str(f)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(str(dist.locate_file(f))), target)
    info = dest / f"kplan-{dist.version}.dist-info"
    info.mkdir(parents=True)
    for name in _DIST_INFO_KEEP:
        text = dist.read_text(name)
        if text is not None:
            (info / name).write_text(text, encoding="utf-8")
    (info / "WHEEL").write_text(
        "Wheel-Version: 1.0\nGenerator: kplan\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    return True


def _zip_wheel(tree: Path, out: Path) -> None:
    """``tree`` (a wheel's content, from :func:`_copy_installed`) as a wheel, with its RECORD."""
    import base64
    import zipfile

    info = next(tree.glob("kplan-*.dist-info"))
    version = info.name[len("kplan-") : -len(".dist-info")]
    out.mkdir(parents=True, exist_ok=True)
    record: list[str] = []
    paths = sorted(p for p in tree.rglob("*") if p.is_file())
    with zipfile.ZipFile(
        out / f"kplan-{version}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED
    ) as zf:
        for path in paths:
            name = path.relative_to(tree).as_posix()
            data = path.read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{name},sha256={digest.decode()},{len(data)}")
            zf.writestr(name, data)
        record.append(f"{info.name}/RECORD,,")
        zf.writestr(f"{info.name}/RECORD", "\n".join(record) + "\n")


def _described(path: Path) -> NodeWheel:
    return NodeWheel(path, sha256_file(path), path.stat().st_size)


MIN_SETUPTOOLS = 77  # pyproject.toml's [build-system] requirement (the SPDX license string)


def setuptools_major() -> int:
    """The major version of the launcher's setuptools, 0 when it has none."""
    from importlib import metadata

    try:
        return int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return 0


def build_command(src: Path, out: Path, have_setuptools: bool | None = None) -> list[str]:
    """pip's command that builds the wheel. With setuptools >= 77 in the launcher's Python
    (pyproject.toml's build requirement: ``scripts/setup.sh`` installs it) the build is
    offline: no isolation, no index. Without it (a 3.12+ venv made by ``pip install -e`` has
    none; a 3.11 venv has an older one, which cannot read pyproject's license field), pip
    builds in isolation and fetches only the build backend (setuptools) from the configured
    index; kplan itself never comes from there."""
    if have_setuptools is None:
        have_setuptools = setuptools_major() >= MIN_SETUPTOOLS
    offline = ["--no-build-isolation", "--no-index"] if have_setuptools else []
    return [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        *offline,
        "--quiet",
        "--wheel-dir",
        str(out),
        str(src),
    ]


def _run_build(src: Path, out: Path, timeout_s: float) -> None:
    cmd = build_command(src, out)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    try:
        proc = subprocess.run(
            cmd, cwd=src, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise CloudError(
            f"building kplan's wheel for the nodes took longer than {timeout_s:g} s",
            hint="retry; check that this machine is not overloaded",
        ) from None
    if proc.returncode != 0:
        errors = [ln.strip() for ln in proc.stderr.splitlines() if "error" in ln.lower()]
        last = (errors or [ln for ln in proc.stderr.splitlines() if ln.strip()] or ["no output"])[
            -1
        ]
        raise CloudError(
            f"building kplan's wheel for the nodes failed: {last[:300]}",
            hint=f"the launcher's Python needs pip and setuptools>={MIN_SETUPTOOLS} "
            f"(pip install 'setuptools>={MIN_SETUPTOOLS}'); run with --debug for more",
        )


def read_wheel(path: str, sha256: str) -> bytes:
    """The wheel's bytes for the upload, after checking them against the job's sha256."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise CloudError(
            f"cannot read kplan's wheel {path}: {err.strerror or err}",
            hint="launch again: the wheel is rebuilt when it is missing",
        ) from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise CloudError(
            f"kplan's wheel {path} changed since the job was planned (sha256 {got[:12]}..., "
            f"expected {sha256[:12]}...)",
            hint="launch again; do not edit files under KPLAN_HOME/wheels",
        )
    return data


def _public(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: the local label names a build of this machine's index (a
    CPU wheel here); the node's index picks its own build of the same release."""
    return version.split("+", 1)[0]


def node_requirements() -> tuple[str, ...]:
    """pip requirements for a node: kplan's dependencies and its ``torch`` extra, each pinned
    to the version the launcher runs (``name==X``), or as kplan declares it when the launcher
    does not have it (a planner-only install has no torch)."""
    fallback = ["numpy>=1.26", "scipy>=1.11", "typer>=0.12", "rich>=13", "torch>=2.3"]
    return _pinned(_NODE_EXTRAS, fallback, base=True)


def sdk_requirements(cloud: str) -> tuple[str, ...]:
    """The cloud SDK a controller node runs the job's provider with (kplan's ``aws`` / ``gcp``
    extra), pinned to the launcher's versions as :func:`node_requirements` pins."""
    fallback = {"aws": ["boto3>=1.34"], "gcp": ["google-cloud-compute>=1.57,<2"]}.get(cloud, [])
    fallback = [f'{r}; extra == "{cloud}"' for r in fallback]
    return _pinned((cloud,), fallback, base=False)


def _pinned(extras: tuple[str, ...], fallback: list[str], *, base: bool) -> tuple[str, ...]:
    """kplan's declared requirements of ``extras`` (and, ``base``, its own), pinned."""
    try:
        declared = importlib.metadata.requires("kplan") or []
    except importlib.metadata.PackageNotFoundError:
        declared = fallback
    out: list[str] = []
    for req in declared:
        spec, _, marker = req.partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if (extra is None and not base) or (extra is not None and extra.group(1) not in extras):
            continue
        match = _NAME.match(spec)
        if match is None:
            continue
        name = match.group(1)
        try:
            out.append(f"{name}=={_public(importlib.metadata.version(name))}")
        except importlib.metadata.PackageNotFoundError:
            out.append(spec.strip().replace(" ", ""))
    return tuple(dict.fromkeys(out))


_INDEX_SCHEMES = ("http", "https", "file")
_WHEEL_NAME = re.compile(
    r"^kplan-[A-Za-z0-9_.+!]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl$"
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[^\s;]+)*$")


def check_index_url(url: str) -> str:
    """``--pip-index-url``: an http(s):// or file:// URL with no credentials in it (it is
    written into the instances' user-data, which anyone allowed to describe them can read)."""
    from urllib.parse import urlparse

    if not url or any(c.isspace() or not c.isprintable() for c in url):
        raise InputError(
            f"--pip-index-url {url!r} is empty or holds spaces or control characters",
            hint="e.g. --pip-index-url https://pypi.example.com/simple",
        )
    parsed = urlparse(url)
    if parsed.scheme not in _INDEX_SCHEMES or (parsed.scheme != "file" and not parsed.netloc):
        raise InputError(
            f"--pip-index-url {url!r} is not an http://, https:// or file:// URL",
            hint="e.g. --pip-index-url https://pypi.example.com/simple",
        )
    if parsed.username is not None or parsed.password is not None:
        raise InputError(
            "--pip-index-url holds a user name or password, which would be written into the "
            "instances' user-data",
            hint="give the nodes access another way (an index reachable from the VPC, or a "
            "pip.conf baked into --image)",
        )
    return url


def check_node_install(
    wheel: str | None, sha256: str | None, requirements: tuple[str, ...]
) -> None:
    """A JobSpec's wheel fields: both or neither, a wheel's file name, a sha256, and pip
    requirements that are requirements (never options such as ``--index-url``)."""
    if (wheel is None) != (sha256 is None):
        raise InputError(
            "a job's kplan wheel needs both its path and its sha256",
            hint="let kplan launch build it",
        )
    if wheel is not None and not _WHEEL_NAME.match(Path(wheel).name):
        raise InputError(f"{Path(wheel).name!r} is not a kplan wheel's file name", hint="rebuild")
    if sha256 is not None and not _SHA256.match(sha256):
        raise InputError(f"kplan wheel sha256 {sha256!r} is not 64 hex digits", hint="rebuild")
    for req in requirements:
        if not isinstance(req, str) or not _REQUIREMENT.match(req):
            raise InputError(
                f"node requirement {req!r} is not a pip requirement such as torch==2.5.1",
                hint="name[extras] with optional version specifiers, no options or spaces",
            )
