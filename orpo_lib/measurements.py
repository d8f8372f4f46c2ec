"""Measured numbers the workbook shows: benchmark records in ``figures/data`` and published anchors.

A benchmark record is the JSON that ``python -m orpo_lib.bench`` writes on a GPU machine:
``{"provenance": {...}, "results": [...], "sweeps": {...}}``. Nothing here invents data: when no
record exists the loaders return nothing and callers say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "figures" / "data"

NO_RECORD_MESSAGE = (
    "No GPU benchmark record in figures/data yet: the measured curves appear once "
    "`make bench` has run on a GPU machine and its JSON is committed."
)


@dataclass(frozen=True)
class BenchRecord:
    """One benchmark run: where and how it was measured, its results and optional sweeps."""

    provenance: dict
    results: list[dict]
    sweeps: dict = field(default_factory=dict)
    source: str = ""

    def select(self, provider: str | None = None, mode: str | None = None, status: str | None = "ok", **shape) -> list[dict]:
        """Results matching a provider, mode, status and any shape fields (batch=, seq=, ...)."""
        return [
            r
            for r in self.results
            if (provider is None or r["provider"] == provider)
            and (mode is None or r["mode"] == mode)
            and (status is None or r.get("status", "ok") == status)
            and all(r.get(k) == v for k, v in shape.items())
        ]


def load_bench_record(path: str | Path) -> BenchRecord:
    """Read one benchmark JSON."""
    raw = json.loads(Path(path).read_text())
    return BenchRecord(provenance=raw["provenance"], results=raw.get("results", []), sweeps=raw.get("sweeps") or {}, source=Path(path).name)


def is_gpu_record(record: BenchRecord) -> bool:
    """True for a run on a GPU (bench.py names a CPU run "CPU (...)")."""
    return not str(record.provenance.get("gpu") or "CPU").startswith("CPU")


def load_bench_records(data_dir: str | Path | None = None, pattern: str = "bench-*.json") -> list[BenchRecord]:
    """Every benchmark record in ``data_dir`` (default ``figures/data``): CPU runs first, then GPU runs, oldest first."""
    directory = Path(data_dir) if data_dir else DATA_DIR
    records = [load_bench_record(p) for p in sorted(directory.glob(pattern))]
    return sorted(records, key=lambda r: (is_gpu_record(r), str(r.provenance.get("date", "")), r.source))


def latest_bench_record(data_dir: str | Path | None = None, pattern: str = "bench-*.json") -> BenchRecord | None:
    """The newest record (a CPU record only when there is no GPU one), or None when there is none.

    A sweep too long for one command is recorded as several runs of the same commit on the same
    GPU (e.g. one per sequence length, each with its own floor): those are read as one record.
    """
    records = load_bench_records(data_dir, pattern)
    if not records:
        return None
    newest = records[-1]
    same_run = [r for r in records if is_gpu_record(r) == is_gpu_record(newest)
                and r.provenance.get("commit") == newest.provenance.get("commit")
                and r.provenance.get("gpu") == newest.provenance.get("gpu")]
    if len(same_run) == 1:
        return newest
    provenance = dict(newest.provenance, command="; ".join(r.provenance.get("command", "") for r in same_run),
                      date=min(str(r.provenance.get("date", "")) for r in same_run))
    sweeps = {}
    for r in same_run:
        sweeps.update(r.sweeps)
    return BenchRecord(provenance, [row for r in same_run for row in r.results], sweeps,
                       source=", ".join(r.source for r in same_run))


# The providers ``python -m orpo_lib.bench`` measures, in the order the workbook lists them.
BENCH_PROVIDERS = ("floor", "baseline", "fused", "fused_lean", "liger")


def floor_mode(mode: str) -> str:
    """The floor rows a mode is compared with: the three GEMMs for "full"; the logits GEMM alone
    (recorded as mode "eval") for "eval" and "forward", which has no floor rows of its own."""
    return "full" if mode == "full" else "eval"


def batch_scaling_rows(record: BenchRecord, *, mode: str, seq: int, hidden: int, vocab: int, batches: list[int],
                       mask: str = "none") -> list[dict]:
    """Per batch and provider: median ms, ratio to the floor measured in the same run, peak over inputs, status.

    Only workloads the record holds give rows; a failed run (e.g. "oom") keeps its status and no numbers.
    """
    rows = []
    for batch in batches:
        shape = {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab, "mask": mask}
        floor = record.select(provider="floor", mode=floor_mode(mode), **shape)
        floor_ms = floor[0]["median_ms"] if floor else None
        for provider in BENCH_PROVIDERS:
            found = record.select(provider=provider, mode=floor_mode(mode) if provider == "floor" else mode, status=None, **shape)
            if not found:
                continue
            result = found[0]
            status = result.get("status") or "ok"
            ok = status == "ok"
            rows.append({
                "batch": batch,
                "provider": provider,
                "median_ms": result["median_ms"] if ok else None,
                "x_floor": result["median_ms"] / floor_ms if ok and floor_ms else None,
                "peak_over_inputs_gib": result.get("peak_over_inputs_gib") if ok else None,
                "status": status,
            })
    return rows


def provenance_caption(provenance: dict) -> str:
    """One line naming the GPU, software versions, date and commit the data came from."""
    parts = [provenance.get("gpu") or "unknown GPU"]
    for name in ("torch", "triton", "liger"):
        if provenance.get(name):
            parts.append(f"{name} {provenance[name]}")
    parts.append(provenance.get("date") or "undated")
    commit = provenance.get("commit")
    parts.append(f"commit {commit[:10]}" if commit else "no commit recorded")
    caption = "Data: " + ", ".join(parts)
    if provenance.get("command"):
        caption += f"; `{provenance['command']}`"
    return caption


def _anchor_results() -> list[dict]:
    # (batch, seq, floor ms, baseline ms, Liger ms, baseline GiB, Liger GiB), full = forward + backward.
    # Their baseline is the seed benchmark's TRL-style reference ("seed_baseline" here).
    table = [
        (2, 1024, 8.9, 14.2, 16.5, 3.4, 3.0),
        (4, 1024, 18.3, 28.3, 27.9, 6.8, 3.0),
        (8, 1024, 37.5, 56.9, 50.8, 13.7, 3.0),
        (16, 1024, 76.8, 115.8, 100.4, 27.4, 3.1),
        (2, 4096, 37.4, 56.5, 46.9, 13.7, 8.9),
        (4, 4096, 76.2, 116.1, 90.8, 27.4, 8.9),
        (8, 4096, 152.1, 238.3, 180.0, 54.8, 9.1),
        (16, 4096, 304.0, 471.9, 364.9, 109.6, 9.3),
    ]
    shape = {"hidden": 4096, "vocab": 128256, "dtype": "bfloat16", "mode": "full", "status": "ok", "chunk_size": None, "mask": "none"}
    results = []
    for batch, seq, floor_ms, baseline_ms, liger_ms, baseline_gib, liger_gib in table:
        for provider, ms, gib in (("floor", floor_ms, None), ("seed_baseline", baseline_ms, baseline_gib), ("liger", liger_ms, liger_gib)):
            results.append({"provider": provider, "batch": batch, "seq": seq, "median_ms": ms, "peak_over_inputs_gib": gib, **shape})
    return results


# Side-by-side run on one H200 (project notes, "Anchors measured side by side").
H200_ANCHORS = BenchRecord(
    provenance={
        "gpu": "NVIDIA H200",
        "torch": "2.11.0+cu130",
        "triton": "3.6.0",
        "liger": "0.8.5",
        "date": "2026-12-02",
        "commit": None,
        "command": "side-by-side anchor run: floor GEMMs, TRL-style baseline, Liger ORPO",
    },
    results=_anchor_results(),
    source="anchors (project notes)",
)

# The seed record: Liger's ORPO benchmark script on an A100 (2024), forward mode, T=1024,
# H=4096, V=128256, bf16. Its Hugging Face provider is "seed_baseline" here.
SEED_A100_FORWARD = BenchRecord(
    provenance={
        "gpu": "NVIDIA A100",
        "date": "2024",
        "commit": None,
        "command": "Liger-Kernel benchmark_orpo_loss.py, forward mode",
    },
    results=[
        {"provider": provider, "mode": "forward", "batch": batch, "seq": 1024, "hidden": 4096, "vocab": 128256,
         "dtype": "bfloat16", "median_ms": ms, "peak_over_inputs_gib": None, "status": "ok", "chunk_size": None, "mask": "none"}
        for provider, series in (("seed_baseline", (12.9, 25.6, 51.8, 103.9)), ("liger", (31.0, 60.9, 121.1, 244.4)))
        for batch, ms in zip((2, 4, 8, 16), series)
    ],
    source="seed record (published A100 numbers)",
)

# Peak allocated over the inputs, forward + backward, measured on one H200 to check the memory
# model against the code (H=4096, V=128256, bf16, random targets and nll_target). "seed_baseline"
# is a loss written like the seed benchmark's Hugging Face reference (cross-entropy over the chosen
# half plus a full fp32 log_softmax): it reproduces the anchors' baseline memory column exactly.
H200_MEMORY_CHECK = BenchRecord(
    provenance={
        "gpu": "NVIDIA H200",
        "torch": "2.11.0+cu130",
        "triton": "3.6.0",
        "date": "2026-12-02",
        "commit": "69c8fe58946bfcb15306d2af69269cc394a9fb37",
        "command": "torch.cuda.max_memory_allocated() over one forward+backward, per implementation",
    },
    results=[
        {"provider": provider, "mode": "full", "batch": batch, "seq": seq, "hidden": 4096, "vocab": 128256,
         "dtype": "bfloat16", "chunk_size": chunk_size, "fp32_weight_grad": fp32_dw, "median_ms": None,
         "peak_over_inputs_gib": gib, "status": "ok", "mask": "none"}
        for (batch, seq), row in {
            (2, 1024): (2.9668, 3.4258, 1.5460, 1.2935, 2.9512),
            (8, 1024): (11.7423, 13.6992, 3.2171, 1.3406, 2.9983),
            (2, 4096): (11.7423, 13.6992, 3.2484, 1.3406, 2.9983),
            (8, 4096): (46.9691, 54.7969, 4.6026, 1.5288, 3.1864),
        }.items()
        for (provider, chunk_size, fp32_dw), gib in zip(
            (("baseline", None, None), ("seed_baseline", None, None), ("fused", None, True),
             ("fused_lean", 1024, False), ("fused", 1024, True)),
            row,
        )
    ],
    source="memory check (H200)",
)


def format_table(rows: list[dict], columns: list[str], formats: dict | None = None) -> str:
    """A fixed-width text table (prints the same in a notebook, a terminal and a test log)."""
    formats = formats or {}

    def cell(row, col):
        value = row.get(col)
        if value is None:
            return "—"
        return format(value, formats[col]) if col in formats else str(value)

    cells = [[cell(r, c) for c in columns] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)
