"""Measured numbers the workbook shows: benchmark records in ``figures/data`` and published anchors.

A benchmark record is the JSON that ``python -m orpo_lib.workbook.bench`` writes on a GPU machine:
``{"provenance": {...}, "results": [...], "sweeps": {...}}``. Nothing here invents data: when no
record exists the loaders return nothing and callers say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2] / "figures" / "data"

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


# The providers ``python -m orpo_lib.workbook.bench`` measures, in the order the workbook lists them.
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


def floor_ratios(record: BenchRecord, *, mode: str, provider: str = "fused", mask: str = "none") -> list[dict]:
    """Every workload where ``provider`` ran in ``mode``: median ms and its ratio to the same run's floor."""
    rows = []
    for r in record.select(provider=provider, mode=mode, mask=mask):
        shape = {k: r[k] for k in ("batch", "seq", "hidden", "vocab")}
        floor = record.select(provider="floor", mode=floor_mode(mode), mask="none", **shape)
        if floor:
            rows.append({**shape, "median_ms": r["median_ms"], "floor_ms": floor[0]["median_ms"],
                         "x_floor": r["median_ms"] / floor[0]["median_ms"]})
    return sorted(rows, key=lambda r: (r["seq"], r["batch"]))


def mask_rows(record: BenchRecord, providers: tuple[str, ...] = ("floor", "baseline", "liger", "fused")) -> list[dict]:
    """Per workload, mask and provider of a mask run: median ms and its ratio to the floor with every
    token counted (mask "none") of the same run and workload."""
    rows = []
    shapes = sorted({(r["batch"], r["seq"], r["hidden"], r["vocab"]) for r in record.results})
    masks = sorted({r.get("mask", "none") for r in record.results}, key=lambda m: (m != "none", m))
    for batch, seq, hidden, vocab in shapes:
        shape = {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab}
        floor = record.select(provider="floor", mode="full", mask="none", **shape)
        for mask in masks:
            for provider in providers:
                found = record.select(provider=provider, mode="full", mask=mask, **shape)
                if found and floor:
                    rows.append({"batch": batch, "seq": seq, "mask": mask, "provider": provider,
                                 "median_ms": found[0]["median_ms"], "x_unmasked_floor": found[0]["median_ms"] / floor[0]["median_ms"],
                                 "peak_over_inputs_gib": found[0].get("peak_over_inputs_gib")})
    return rows


def kernel_kind(name: str) -> str:
    """Which part of the fused loss a profiled kernel belongs to: cuBLAS GEMM, Triton row kernel, or small torch op."""
    if name.startswith(("nvjet", "sm90_xmma", "ampere_", "cutlass")) or "gemm" in name.lower():
        return "GEMM (cuBLAS)"
    if name.endswith("_kernel") and not name.startswith("void"):
        return "row kernel (Triton)"
    return "small torch ops"


def profile_summary(profile: list[dict]) -> list[dict]:
    """Device milliseconds and launches of one profiled call, per kind of kernel, largest first."""
    kinds: dict[str, dict] = {}
    for p in profile:
        kind = kinds.setdefault(kernel_kind(p["kernel"]), {"kind": kernel_kind(p["kernel"]), "kernels": 0, "calls": 0, "device_ms": 0.0})
        kind["kernels"] += 1
        kind["calls"] += p["calls"]
        kind["device_ms"] += p["device_ms"]
    total = sum(k["device_ms"] for k in kinds.values())
    rows = sorted(kinds.values(), key=lambda k: -k["device_ms"])
    for row in rows:
        row["share_pct"] = 100.0 * row["device_ms"] / total
    return rows


def short_kernel_name(name: str, width: int = 48) -> str:
    """A profiled kernel's name cut to ``width`` characters (torch's template names run to hundreds)."""
    return name if len(name) <= width else name[: width - 1] + "…"


def accuracy_rows(record: BenchRecord) -> list[dict]:
    """bf16 relative errors against float64, one row per workload and quantity, fused next to baseline."""
    rows = []
    for entry in record.sweeps.get("accuracy") or []:
        w = entry["workload"]
        errors = entry["relative_error"]
        for quantity in ("loss", "grad_hidden", "grad_weight"):
            fused, baseline = errors["fused"][quantity], errors["baseline"][quantity]
            counted = w["seq"] // 2 if w.get("mask") == "prompt-half" else w["seq"]
            rows.append({"batch": w["batch"], "seq": w["seq"], "mask": w.get("mask", "none"), "nll_tokens": w["batch"] // 2 * counted,
                         "quantity": quantity, "fused": fused, "baseline": baseline, "fused_over_baseline": fused / baseline})
    return rows


def best_row_kernel(record: BenchRecord, kernel: str) -> dict | None:
    """The fastest launch configuration recorded for one row kernel ("stats", "grads")."""
    points = [p for p in record.sweeps.get("row_kernel") or [] if p["kernel"] == kernel]
    return max(points, key=lambda p: p["gbps"]) if points else None


def stage_ms(record: BenchRecord, stage: str) -> float | None:
    """Median milliseconds of one recorded stage, or None when the stages sweep lacks it."""
    found = [s["median_ms"] for s in record.sweeps.get("stages") or [] if s["stage"] == stage]
    return found[0] if found else None


def floor_tflops(record: BenchRecord, mode: str = "eval") -> float:
    """Median TFLOP/s the floor reached in a record (mode "eval": the logits GEMM alone)."""
    values = sorted(r["tflops"] for r in record.select(provider="floor", mode=mode) if r.get("tflops"))
    return values[len(values) // 2]


def logit_read_share(gemm_tflops: float, bandwidth_tbps: float, hidden: int, dtype_bytes: int = 2) -> float:
    """Time to read each logit once from HBM over the time the GEMM spends on its 2·H FLOPs: the least a
    forward that reads the logits after the GEMM adds to it."""
    return (dtype_bytes / (bandwidth_tbps * 1e12)) / (2 * hidden / (gemm_tflops * 1e12))


def provenance_caption(provenance: dict, source: str = "") -> str:
    """One short line: GPU, torch/triton/liger versions, date, short commit and the record's files."""
    parts = [provenance.get("gpu") or "unknown GPU"]
    for name in ("torch", "triton", "liger"):
        if provenance.get(name):
            parts.append(f"{name} {provenance[name]}")
    parts.append(str(provenance.get("date") or "undated")[:10])
    commit = provenance.get("commit")
    parts.append(f"commit {commit[:7]}" if commit else "no commit")
    caption = ", ".join(parts)
    return f"{caption} ({source})" if source else caption


def record_caption(record: "BenchRecord") -> str:
    """``provenance_caption`` of a record, naming its files."""
    return provenance_caption(record.provenance, record.source)


def sweep_shape(record: "BenchRecord", sweep: str) -> dict | None:
    """(batch, seq, hidden, vocab) a sweep ran at, from the command of the run that recorded it.

    A record read from several runs joins their commands with "; "; bench.py's default sweep
    shape is 8x4096 at the record's hidden and vocab sizes.
    """
    for command in str(record.provenance.get("command") or "").split("; "):
        words = command.split()
        sweeps = words[words.index("--sweeps") + 1].split(",") if "--sweeps" in words else []
        if sweep not in sweeps:
            continue
        batch, seq = (int(v) for v in (words[words.index("--sweep-shape") + 1] if "--sweep-shape" in words else "8x4096").split("x"))
        first = record.results[0] if record.results else {}
        hidden = int(words[words.index("--hidden") + 1]) if "--hidden" in words else first.get("hidden", 4096)
        vocab = int(words[words.index("--vocab") + 1]) if "--vocab" in words else first.get("vocab", 128256)
        return {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab}
    return None


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
    source="H200 anchors",
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
    source="seed A100 record",
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


def _shape_text(row: dict) -> str:
    return f"{row['batch']}×{row['seq']}"


def time_findings(record: BenchRecord, target: float = 1.05) -> list[str]:
    """What the record says about time against the floor, as sentences with the numbers computed here."""
    from . import memory

    lines = []
    full = floor_ratios(record, mode="full")
    if full:
        met = [_shape_text(r) for r in full if round(r["x_floor"], 2) <= target]
        low, high = min(full, key=lambda r: r["x_floor"]), max(full, key=lambda r: r["x_floor"])
        lines.append(f"Fused forward+backward: {low['x_floor']:.3f}× ({_shape_text(low)}) to {high['x_floor']:.3f}× ({_shape_text(high)}) "
                     f"the three-GEMM floor over {len(full)} workloads; target ≤{target:.2f} met (at two decimals) only at "
                     f"{', '.join(met) or 'none'}.")
    no_grad = floor_ratios(record, mode="eval")
    if no_grad:
        met = [_shape_text(r) for r in no_grad if round(r["x_floor"], 2) <= target]
        low, high = min(r["x_floor"] for r in no_grad), max(r["x_floor"] for r in no_grad)
        tflops = floor_tflops(record)
        hidden = no_grad[0]["hidden"]
        share = logit_read_share(tflops, memory.H200_ROW_KERNEL_TBPS, hidden)
        lines.append(f"Fused forward without gradients: {low:.3f}× to {high:.3f}× the logits GEMM; target ≤{target:.2f} met "
                     f"(at two decimals) only at {', '.join(met) or 'none'}. At the GEMM's measured {tflops:.0f} TFLOP/s and "
                     f"{memory.H200_ROW_KERNEL_TBPS} TB/s, the statistics pass (one 2-byte read per logit) costs "
                     f"{100 * share:.1f}% of its 2·H={2 * hidden} FLOPs: a lower ratio means the chunked GEMMs ran faster "
                     f"than the floor's single one.")
    lean = floor_ratios(record, mode="full", provider="fused_lean")
    if lean:
        largest = max(lean, key=lambda r: r["batch"] * r["seq"])
        (row,) = record.select(provider="fused_lean", mode="full", batch=largest["batch"], seq=largest["seq"], mask="none")
        chunk = memory.chunking(largest["batch"], largest["seq"], memory.LEAN_CHUNK_ROWS, largest["vocab"])
        blocks = chunk.count // (largest["batch"] // 2)
        gemms = 3 + (blocks - 1) / blocks
        lines.append(f"Lean (blocks of at most {memory.LEAN_CHUNK_ROWS} rows, two passes, dW in the weight dtype) at "
                     f"{_shape_text(largest)}: {row['peak_over_inputs_gib']:.2f} GiB at {largest['x_floor']:.2f}× the floor "
                     f"({blocks} blocks a pair, {blocks - 1} of them computed twice: {gemms:.2f} GEMMs, {gemms / 3:.2f}×, "
                     f"plus the row passes and one dW accumulation per block).")
    return lines


def memory_findings(record: BenchRecord) -> list[str]:
    """Measured peaks of the fused loss against Liger's, as sentences with the numbers computed here."""
    lines = []
    pairs = []
    for fused in record.select(provider="fused", mode="full", mask="none"):
        shape = {k: fused[k] for k in ("batch", "seq", "hidden", "vocab")}
        liger = record.select(provider="liger", mode="full", mask="none", **shape)
        if liger and fused.get("peak_over_inputs_gib") and liger[0].get("peak_over_inputs_gib"):
            pairs.append((fused, liger[0]))
    if not pairs:
        return lines
    fused, liger = max(pairs, key=lambda p: p[0]["batch"] * p[0]["seq"])
    lines.append(f"At {_shape_text(fused)} the fused loss peaks at {fused['peak_over_inputs_gib']:.2f} GiB over the inputs, "
                 f"Liger at {liger['peak_over_inputs_gib']:.2f} GiB.")
    for seq in sorted({f["seq"] for f, _ in pairs}):
        ratios = [f["peak_over_inputs_gib"] / l["peak_over_inputs_gib"] for f, l in pairs if f["seq"] == seq]
        lines.append(f"T={seq}: fused/Liger peak {min(ratios):.2f}–{max(ratios):.2f}× (the fused loss keeps dW in fp32 across chunks).")
    return lines


def kernel_findings(record: BenchRecord) -> list[str]:
    """Row kernel bandwidth, the cost of fp32 dW accumulation and the per-call overhead, from the sweeps."""
    from . import memory

    lines = []
    for kernel in ("stats", "grads"):
        best = best_row_kernel(record, kernel)
        if best:
            lines.append(f"Row kernel, {kernel}: best {best['gbps'] / 1e3:.2f} TB/s (BLOCK_V={best['block_v']}, "
                         f"num_warps={best['num_warps']}); the roofline assumes {memory.H200_ROW_KERNEL_TBPS} TB/s.")
    fp32, dtype = stage_ms(record, "dW GEMM (fp32 accumulate)"), stage_ms(record, "dW GEMM (weight dtype out)")
    if fp32 and dtype:
        rows = (record.sweeps.get("stages") or [{}])[0].get("chunk_rows")
        lines.append(f"dW accumulated in fp32 across chunks costs {fp32 - dtype:.2f} ms per {rows}-row chunk over a dW GEMM "
                     f"that writes the weight dtype ({fp32:.2f} vs {dtype:.2f} ms).")
    profile = record.sweeps.get("profile") or []
    if profile:
        kinds = {k["kind"]: k for k in profile_summary(profile)}
        small = kinds.get("small torch ops")
        if small:
            lines.append(f"One profiled fused forward+backward launches at least {small['calls']} small torch kernels "
                         f"({small['kernels']} kinds, {small['device_ms']:.2f} ms of device time, {small['share_pct']:.1f}%): "
                         f"with the validation sync, a fixed per-call cost that weighs most at small shapes.")
    return lines


def mask_findings(record: BenchRecord) -> list[str]:
    """Time with the prompt half ignored, over the unmasked floor of the same run and workload."""
    rows = mask_rows(record)
    lines = []
    for batch, seq in sorted({(r["batch"], r["seq"]) for r in rows}):
        masked = {r["provider"]: r["x_unmasked_floor"] for r in rows if (r["batch"], r["seq"]) == (batch, seq) and r["mask"] != "none"}
        if "fused" in masked:
            others = ", ".join(f"{p} {masked[p]:.2f}×" for p in ("baseline", "liger") if p in masked)
            lines.append(f"{batch}×{seq}, prompt half ignored: fused {masked['fused']:.2f}× the unmasked floor; {others}.")
    return lines
