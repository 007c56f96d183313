"""Stand-ins for a cloud node's tools, so that tests run a generated bootstrap script itself.

``aws`` and ``gsutil`` copy between the node's folders and a temporary folder playing the
bucket (``$FAKE_S3`` / ``$FAKE_GCS``: ``s3://b/p/x`` is ``$FAKE_S3/b/p/x``); ``hostname -I``
answers 127.0.0.1; ``poweroff`` touches a marker file instead of stopping the machine, and
``shutdown`` (the hard stop's timer) writes its arguments to ``<marker>.shutdown``.
"""

from __future__ import annotations

import stat
from pathlib import Path

AWS_STUB = r"""#!/bin/bash
# aws s3 cp|sync SRC DST [--flags [value]]: a bucket in $FAKE_S3
shift; verb=$1; shift; pos=()
while [ $# -gt 0 ]; do
  case "$1" in --exclude) shift 2;; --*) shift;; *) pos+=("$1"); shift;; esac
done
map() { case "$1" in s3://*) echo "$FAKE_S3/${1#s3://}";; *) echo "$1";; esac; }
src=$(map "${pos[0]}"); dst=$(map "${pos[1]}")
if [ "$verb" = cp ] && [ "$dst" = - ]; then
  [ -f "$src" ] || exit 1; cat "$src"
elif [ "$verb" = cp ]; then
  [ -f "$src" ] || exit 1; mkdir -p "$(dirname "$dst")"; cp "$src" "$dst"
else
  mkdir -p "$dst"; if [ -d "$src" ]; then cp -r "$src/." "$dst/"; fi
fi
"""

GSUTIL_STUB = r"""#!/bin/bash
# gsutil [-q] [-m] cp SRC DST | cat SRC | rsync -r [-x PATTERN] SRC DST: a bucket in $FAKE_GCS
pos=()
while [ $# -gt 0 ]; do
  case "$1" in -x) shift 2;; -*) shift;; *) pos+=("$1"); shift;; esac
done
verb=${pos[0]}
map() { case "$1" in gs://*) echo "$FAKE_GCS/${1#gs://}";; *) echo "$1";; esac; }
src=$(map "${pos[1]}"); dst=$(map "${pos[2]}")
if [ "$verb" = cat ]; then
  [ -f "$src" ] || exit 1; cat "$src"
elif [ "$verb" = cp ]; then
  [ -f "$src" ] || exit 1; mkdir -p "$(dirname "$dst")"; cp "$src" "$dst"
else
  mkdir -p "$dst"; if [ -d "$src" ]; then cp -r "$src/." "$dst/"; fi
fi
"""


def write_tool(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def node_tools(folder: Path, powered_off: Path) -> Path:
    """``aws``, ``gsutil``, ``hostname`` and ``poweroff`` in ``folder`` (put it first on PATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_tool(folder, "aws", AWS_STUB)
    write_tool(folder, "gsutil", GSUTIL_STUB)
    write_tool(folder, "hostname", "#!/bin/sh\necho 127.0.0.1\n")
    write_tool(folder, "poweroff", f"#!/bin/sh\ntouch '{powered_off}'\n")
    write_tool(folder, "shutdown", f"#!/bin/sh\necho \"$@\" > '{powered_off}.shutdown'\n")
    return folder
