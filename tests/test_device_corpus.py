"""benchmarks/device_corpus.py: the archive a lent machine trains the isoflop studies on holds
the files a corpus reads here, byte for byte, and refuses to overwrite one."""

import subprocess
import sys
import tarfile
from pathlib import Path

from attnlab.data import files as files_lib

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "device_corpus.py"


def test_the_archive_unpacks_to_the_corpus_files_and_is_never_overwritten(tmp_path):
    tree = tmp_path / "tree"
    for name, text in {"a.py": b"x = 1\n", "pkg/b.py": b"y = 2\n", "pkg/nul.py": b"z\x00\n",
                       "pkg/empty.py": b"", "notes.txt": b"not python\n"}.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(text)
    out = tmp_path / "c.tar.xz"
    run = [sys.executable, str(SCRIPT), f"--out={out}", f"--root={tree}"]
    made = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    with tarfile.open(out) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    root, files = files_lib.text_files(str(tmp_path / "unpacked" / "pystdlib"))
    assert {str(f.relpath): Path(f.path).read_bytes() for f in files} == {
        "a.py": b"x = 1\n", "pkg/b.py": b"y = 2\n"}  # no 0x00 file, no empty one, only .py
    again = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and str(out) in again.stderr
