"""This machine's `pystdlib` corpus as one archive a lent accelerator session carries.

The `pystdlib` corpus is the running interpreter's standard library, so its size depends on the
machine: here (CPython 3.12.1 from pyenv, with its test suite) 28.6M training tokens, on a lent
H200's image (3.12.3, no test suite) 9.4M, where the first run of the gpu quickstart plan read it
up to three times (docs/benchmarks.md, "Third lent session"). The archive holds the same files
(those the pystdlib source keeps: every non-empty .py file, less those holding the byte 0x00),
which `benchmarks/device_session.sh` unpacks and trains the isoflop studies on as
`data.source=text_files`: the same bytes on both machines.

    python benchmarks/device_corpus.py [--out .corpus/pystdlib.tar.xz] [--root DIR]

Run it with Python 3.12 or newer (`.venv-newer/bin/python` after .ci/run, or a 3.12 venv): the gpu
plans are sized to 3.12.1's standard library, and one run of `architectures.py:gpu` would read
1.01 epochs of 3.11's, which sweep.max_epochs refuses.

--root: archive the .py files under DIR instead (the tests use a small tree). The archive is
never committed (`echo /.corpus/ >> .git/info/exclude`); the device call names it in carry.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

from attnlab.data import files as files_lib
from attnlab.data.tokenizer import EOS_BYTE


def kept_files(root: Path | None) -> tuple[Path, list[Path]]:
    """(root, the .py files the corpus reads, by relative path)."""
    if root is None:
        root, found = files_lib.stdlib_files()
    else:
        root, found = files_lib.text_files(str(root / "**" / "*.py"))
    paths = [Path(f.path) for f in found]
    # The separator byte: pystdlib skips such a file, text_files would refuse it.
    return Path(root), [p for p in paths if bytes([EOS_BYTE]) not in p.read_bytes()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".corpus/pystdlib.tar.xz")
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        print(f"error: {out} exists; remove it to rebuild", file=sys.stderr)
        return 2
    root, paths = kept_files(args.root)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w:xz") as archive:
        for path in paths:
            archive.add(path, arcname=str(Path("pystdlib") / path.relative_to(root)))
    partial.replace(out)
    size = sum(p.stat().st_size for p in paths)
    print(f"{out}: {len(paths)} files, {size / 1e6:.1f} MB of text, "
          f"{out.stat().st_size / 1e6:.1f} MB archived, from {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
