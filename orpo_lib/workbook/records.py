"""Regenerate every record the workbook shows, on the GPU at hand, into figures/data:

    python -m orpo_lib.workbook.records                          # every part, one after the other
    python -m orpo_lib.workbook.records --parts seed-shapes,mask # some of them

Each part is one run of the benchmark harness (or of the TRL training bench) in a process of its own,
written as ``<part>-<gpu>.json`` (``gpu`` as ``bench.device_slug`` names the card, e.g. ``h100``), so
that every number a notebook shows comes from one card and one commit. The settings below aim at the
whole set in ten minutes of an H100 (the parts' seconds are printed at the end: a run is the check), and
parts can be run in separate calls where a machine limits one command's time. The commit comes from ``--commit``, else from git
or ``$ORPO_COMMIT`` as each harness's provenance finds it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from .bench import SEED_SHAPES, SWEEPS, device_slug

SEED = ",".join(f"{b}x{t}" for b, t in SEED_SHAPES)

# part → (module, arguments): what each record measures
PARTS = {
    # the seed table (README, notebooks 3-5): every provider, forward + backward, forward, no-grad forward;
    # and the tuning sweeps of notebook 4 at 8×4096
    "seed-shapes": ("bench", ["--shapes", SEED, "--providers", "floor,baseline,baseline_compiled,fused,fused_lean,liger",
                              "--modes", "full,forward,eval", "--reps", "5", "--warmup", "1",
                              "--sweeps", ",".join(SWEEPS), "--sweep-shape", "8x4096"]),
    # the models most people fine-tune: H 1024 / 2048, V 32000 / 151936 / 256000, 8×2048
    "small-models": ("bench", ["--shapes", "small-models", "--providers", "floor,baseline,baseline_compiled,fused,liger",
                               "--modes", "full,eval", "--reps", "8"]),
    # one pair longer than any chunk, every token kept and with TRL's labels
    "long-context": ("bench", ["--shapes", "long-context", "--masks", "none,trl", "--providers", "floor,baseline,fused,liger",
                               "--modes", "full", "--reps", "5", "--warmup", "1"]),
    # half of every sequence a prompt that no target counts
    "mask": ("bench", ["--shapes", "8x1024,4x4096", "--masks", "none,prompt-half", "--providers", "floor,baseline,fused,liger",
                       "--modes", "full", "--reps", "5", "--warmup", "1"]),
    # stock ORPOTrainer against FusedORPOTrainer end to end
    "trl-training": ("trl_bench", ["--steps", "5", "--warmup", "2", "--max-pairs-cap", "32"]),
}


def part_command(part: str, out_dir: Path, gpu: str, commit: str | None) -> list[str]:
    """The command line that writes ``out_dir/<part>-<gpu>.json``."""
    module, args = PARTS[part]
    command = [sys.executable, "-m", f"orpo_lib.workbook.{module}", *args, "--out", str(out_dir / f"{part}-{gpu}.json")]
    return command + (["--commit", commit] if commit else [])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)}")
    parser.add_argument("--out", default="figures/data", help="folder of the records")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}: expected some of {','.join(PARTS)}")
    if not torch.cuda.is_available() and not args.dry_run:
        raise SystemExit("the workbook's records are GPU measurements: no CUDA device here")
    gpu = device_slug(torch.device("cuda")) if torch.cuda.is_available() else "gpu"
    commit = args.commit  # else each harness asks git, then $ORPO_COMMIT (bench.provenance)
    out_dir = Path(args.out)
    seconds = {}
    for part in parts:
        command = part_command(part, out_dir, gpu, commit)
        print("$ " + " ".join(command[1:]), flush=True)
        if args.dry_run:
            continue
        start = time.monotonic()
        subprocess.run(command, check=True)
        seconds[part] = round(time.monotonic() - start, 1)
        print(f"{part}: {seconds[part]} s", flush=True)
    if seconds:
        print("seconds per part: " + ", ".join(f"{p} {s}" for p, s in seconds.items()) + f"; total {sum(seconds.values()):.0f}")
    return seconds


if __name__ == "__main__":
    main()
