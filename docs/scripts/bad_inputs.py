"""The inputs a new user's run found not clean (2026-11-26: data loss, tracebacks, plans that fail
later, accepted sampling flags), run again against this checkout. Each case's row: its exit
status, the lines it printed on stderr, whether a traceback appeared, and whether every file it
must not touch (a run's, a sweep's, an existing figure) is byte-identical afterwards.

    sudo python docs/scripts/bad_inputs.py [--out docs/results/bad_inputs.md] [--work DIR]

Root is needed for the full-disk and read-only cases (tmpfs mounts); without it they are left
out and listed as such. Clean: exit 2 with one line (or the case's stated handling), no
traceback, nothing touched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.py")


def attnlab(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnlab.cli", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=900)


def digest(root: Path) -> dict[str, str]:
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def mount_tmpfs(path: Path, size: str, *, fill: bool = False, read_only_copy: Path | None = None
                ) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["umount", "-l", str(path)], capture_output=True)  # a rerun's old mount
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode:
        return False
    if read_only_copy is not None:
        shutil.copytree(read_only_copy, path / read_only_copy.name)
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
    if fill:
        (path / "old_plot.png").write_bytes(b"\x89PNG old figure" * 64)
        fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:  # the disk is full
            pass
        os.close(fd)
    return True


def setup(bad: Path) -> dict[str, Path]:
    """A finished tiny run, a finished quickstart, its results table, an mqar run, an mlm run,
    a Hugging Face export; a full disk and a read-only copy of the run where root allows."""
    p = {"t1": bad / "t1", "qs": bad / "qs", "mqar": bad / "mqar", "mlm": bad / "mlm",
         "llama": bad / "llama", "hf": bad / "hf_ok", "zero": bad / "zero", "ro": bad / "ro",
         "w": bad / "w"}
    steps = ["--config.train.steps=20", "--config.train.warmup_steps=2",
             "--config.train.checkpoint_every=20", "--noprogress"]
    runs = (("t1", TINY, []),
            ("mlm", TINY, ["--config.model.objective=mlm", "--config.model.vocab_size=264"]),
            ("llama", TINY, ["--config.model.norm=rmsnorm", "--config.model.ffn=swiglu"]),
            ("mqar", str(REPO / "configs" / "mqar.py"), []))
    for key, config, extra in runs:  # a rerun of the script keeps what it finished
        if not (p[key] / "summary.json").exists():
            done = attnlab("train", f"--config={config}", f"--run={p[key]}", *steps, *extra)
            assert done.returncode == 0, done.stderr[-2000:]
    if not (p["qs"] / "fit.json").exists():
        done = attnlab("quickstart", f"--config={REPO / 'experiments' / 'tiny_isoflop.py'}",
                       f"--sweep={p['qs']}", "--bootstrap=0", "--noprogress")
        assert done.returncode == 0, done.stderr[-2000:]
    (bad / "csv").mkdir(exist_ok=True)
    shutil.copy(p["qs"] / "results.csv", bad / "csv" / "good.csv")
    if not p["hf"].exists():
        assert attnlab("export-hf", f"--run={p['llama']}", f"--to={p['hf']}").returncode == 0
    p["full_disk"] = mount_tmpfs(p["zero"], "64k", fill=True)
    p["read_only"] = mount_tmpfs(p["ro"], "16m", read_only_copy=p["t1"])
    p["w"].mkdir(exist_ok=True)
    return p


def cases(p: dict, bad: Path) -> list[tuple[str, list[str], list[Path], bool]]:
    """(id, argv, files that must stay as they are, needs root)."""
    good, t1, qs, w = bad / "csv" / "good.csv", p["t1"], p["qs"], p["w"]
    fit = ["fit", f"--sweep={good}", "--law=kaplan", "--bootstrap=0"]
    ckpt = next(t1.glob("checkpoints/*/_CHECKPOINT_METADATA"))
    zero, ro = p["zero"], p["ro"] / "t1"
    cc = ["coord-check", f"--config={TINY}", "--steps=2", "--widths=32,64"]
    return [
        ("R_DL12 fit --json onto a run's config", [*fit, f"--json={t1}/config.json"], [t1], 0),
        ("R_DL11b fit --json onto results.csv", ["fit", f"--sweep={qs}", "--bootstrap=0",
                                                 f"--json={qs}/results.csv"], [qs], 0),
        ("R_DL12c fit --json onto summary.json", [*fit, f"--json={t1}/summary.json"], [t1], 0),
        ("R_DL12d fit --json onto metrics.jsonl", [*fit, f"--json={t1}/metrics.jsonl"], [t1], 0),
        ("R_DL12g fit --json onto sweep.json", [*fit, f"--json={qs}/sweep.json"], [qs], 0),
        ("R_DL12h fit --json onto checkpoint metadata", [*fit, f"--json={ckpt}"], [t1], 0),
        ("R_DL12e2 compare --json onto a run's config",
         ["compare", f"--sweep={qs}", "--by=train.seed", "--baseline=0",
          f"--json={t1}/config.json"], [t1], 0),
        ("R_GM05 mlm generate with sampling flags",
         ["generate", f"--run={p['mlm']}", "--prompt=a[MASK]b", "--temperature=0.8",
          "--max-new-tokens=50"], [p["mlm"]], 0),
        ("R_HG01 --allow-large d_model 1e6",
         ["train", f"--config={TINY}", "--noprogress", "--config.model.d_model=1000000",
          "--allow-large", f"--run={w}/hg01"], [], 0),
        ("R_HG08 dry run of a 1e11-parameter shape",
         ["sweep", f"--config={REPO / 'experiments' / 'tiny_grid.py'}",
          "--config.sweep.shapes=((65536, 2, 2, 1e-2),)", f"--sweep={w}/hg08", "--dry-run",
          "--probe=none"], [], 0),
        ("N_CC10 coord-check huge widths",
         ["coord-check", f"--config={TINY}", "--steps=2", "--widths=1000000,2000000"], [], 0),
        ("N_CC12 coord-check --json onto a run's config", [*cc, f"--json={t1}/config.json"],
         [t1], 0),
        ("N_CC13 coord-check --plot=<config.json>", [*cc, f"--plot={t1}/config.json"], [t1], 0),
        ("N_ICL27 icl --json onto the run's config",
         ["icl", f"--run={p['mqar']}", f"--json={p['mqar']}/config.json"], [p["mqar"]], 0),
        ("N_ICL29 icl --plot=<config.json>",
         ["icl", f"--run={p['mqar']}", f"--json={w}/icl29.json", f"--plot={t1}/config.json"],
         [t1, p["mqar"]], 0),
        ("N_ATT01 attention --json onto a run's config",
         ["attention", f"--run={p['mqar']}", "--task-example", f"--plot={w}/att01.png",
          f"--json={t1}/config.json"], [t1], 0),
        ("N_ATT02 attention --plot=<config.json>",
         ["attention", f"--run={p['mqar']}", "--task-example", f"--plot={t1}/config.json",
          f"--json={w}/att02.json"], [t1], 0),
        ("N_IH14 import-hf --run=/proc/x",
         ["import-hf", f"--from={p['hf']}", "--run=/proc/rel_imp"], [], 0),
        ("N_EH06 export-hf --to=/proc/x",
         ["export-hf", f"--run={p['llama']}", "--to=/proc/rel_hf"], [p["llama"]], 0),
        ("N_LD05 ladder with a 1-token branch (dry run)",
         ["sweep", f"--config={REPO / 'experiments' / 'tiny_ladder.py'}", "--dry-run",
          "--probe=none", "--config.sweep.branches.tokens=(1,)", f"--sweep={w}/ld05"], [], 0),
        ("R_FD04 fit --json on a full disk", [*fit, f"--json={zero}/fit.json"], [], 1),
        ("R_FD05 plot on a full disk", ["plot", f"--sweep={good}", "--kind=loss-vs-compute",
                                        f"--plot={zero}/p.png"], [], 1),
        ("R_FD05e re-plot onto an existing figure, full disk",
         ["plot", f"--sweep={good}", "--kind=loss-vs-compute", f"--plot={zero}/old_plot.png",
          "--overwrite"], [zero / "old_plot.png"], 1),
        ("R_FD05b export-hf onto a full disk",
         ["export-hf", f"--run={p['llama']}", f"--to={zero}/hf"], [p["llama"]], 1),
        ("R_FD05c import-hf onto a full disk",
         ["import-hf", f"--from={p['hf']}", f"--run={zero}/imp"], [], 1),
        ("R_RO06 extrapolate a read-only run", ["extrapolate", f"--run={ro}", "--force"],
         [ro], 1),
    ]


def run_case(name, argv, keep, needs_root, p) -> dict:
    if needs_root and not (p["full_disk"] and p["read_only"]):
        return {"case": name, "exit": "-", "stderr lines": "-", "traceback": "-",
                "untouched": "-", "last line": "left out: needs root (tmpfs)"}
    before = {k: v for path in keep for k, v in digest(path).items()}
    done = attnlab(*argv)
    after = {k: v for path in keep for k, v in digest(path).items()}
    err = [line for line in done.stderr.splitlines() if line.strip()]
    out = [line for line in done.stdout.splitlines() if line.strip()]
    last = (err or out or [""])[-1].replace("|", "\\|").replace(str(p["t1"].parent), "$BAD")
    return {"case": name, "exit": done.returncode, "stderr lines": len(err),
            "traceback": "Traceback" in done.stderr + done.stdout,
            "untouched": before == after, "last line": last[:160]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs/results/bad_inputs.md")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    bad = args.work or Path(tempfile.mkdtemp(prefix="bad-inputs-"))
    p = setup(bad)
    try:
        rows = [run_case(*case, p) for case in cases(p, bad)]
    finally:
        for mount in (p["zero"], p["ro"]):
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({"cases": len(rows), "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
