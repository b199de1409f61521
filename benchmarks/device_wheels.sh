#!/usr/bin/env bash
# The wheels a lent accelerator machine needs to run attnlab with its own image's jax: what
# attnlab's dependencies resolve to for Python 3.12 on x86-64 Linux, less what the image has
# (its package list: the device tool's KINDS.md, "Python packages already there"). Run here, on a
# machine with the package registry; the device session carries .whl/ (never committed:
# `echo /.whl/ >> .git/info/exclude`).
#
#   bash benchmarks/device_wheels.sh [IMAGE_PACKAGES_FILE]
#
# IMAGE_PACKAGES_FILE: the image's package names, comma- or line-separated (default: read from
# /work/.library/device/KINDS.md). Pure-Python sdists (promise) are built into wheels here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
IMAGE=${1:-}
KINDS=/work/.library/device/KINDS.md
if [ -z "$IMAGE" ]; then
  IMAGE=$(mktemp)
  sed -n 's/.*their image.*Packages: //p' "$KINDS" > "$IMAGE"
fi
REPORT=$(mktemp)
"$PY" -m pip install -q --dry-run --ignore-installed --report "$REPORT" . >/dev/null
NEEDED=$("$PY" - "$REPORT" "$IMAGE" <<'EOF'
import json, re, sys
def norm(name):
    return re.sub(r"[-_.]+", "-", name.strip().strip(".")).lower()
image = {norm(n) for n in re.split(r"[,\n]", open(sys.argv[2]).read()) if n.strip()}
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if norm(name) not in image | {"attnlab"}:
        print(f"{name}=={version}")
EOF
)
mkdir -p .whl
for spec in $NEEDED; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$spec" 2>/dev/null \
    || "$PY" -m pip wheel -q --no-deps -w .whl "$spec"
done
echo "$(ls .whl | wc -l) wheels in .whl ($(du -sh .whl | cut -f1)):"
ls .whl
