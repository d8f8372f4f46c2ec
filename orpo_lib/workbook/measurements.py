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
        # the floor's GEMMs do not read the labels: the unmasked floor, or the one run beside this mask
        floor = (record.select(provider="floor", mode=floor_mode(mode), mask="none", **shape)
                 or record.select(provider="floor", mode=floor_mode(mode), mask=mask, **shape))
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


# Side-by-side run on one H200 of the floor GEMMs, the seed benchmark's TRL-style baseline ("seed_baseline")
# and Liger's ORPO loss; and the seed record, Liger's ORPO benchmark script on an A100, forward only.
def _anchor_record(name: str) -> BenchRecord:
    """A record in ``figures/data``, or an empty one where the package runs without the repository's data."""
    path = DATA_DIR / name
    return load_bench_record(path) if path.exists() else BenchRecord({}, [], source=f"{name} (not found)")


H200_ANCHORS = _anchor_record("anchors-2026-12-02-h200.json")
SEED_A100_FORWARD = _anchor_record("anchors-2024-a100-forward.json")


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


def shape_text(row: dict) -> str:
    return f"{row['batch']}×{row['seq']}"


def floor_ratio_summary(record: BenchRecord, target: float = 1.05) -> list[dict]:
    """Per provider and mode, the range of the ratio to the floor over the record's workloads, and the
    workloads within ``target`` at two decimals (mode "eval" is compared with the logits GEMM alone)."""
    rows = []
    for provider, mode in (("fused", "full"), ("fused", "eval"), ("fused_lean", "full")):
        ratios = floor_ratios(record, mode=mode, provider=provider)
        if not ratios:
            continue
        low, high = (f(ratios, key=lambda r: r["x_floor"]) for f in (min, max))
        within = [shape_text(r) for r in ratios if round(r["x_floor"], 2) <= target]
        rows.append({"provider": provider, "mode": mode, "workloads": len(ratios),
                     "min_x_floor": low["x_floor"], "at_min": shape_text(low),
                     "max_x_floor": high["x_floor"], "at_max": shape_text(high),
                     f"within_{target:.2f}": ", ".join(within) or "none"})
    return rows


def peak_rows(record: BenchRecord) -> list[dict]:
    """Per forward+backward workload with every token counted: the measured peaks over the inputs."""
    rows = []
    for fused in record.select(provider="fused", mode="full", mask="none"):
        shape = {k: fused[k] for k in ("batch", "seq", "hidden", "vocab")}
        peaks = {p: found[0].get("peak_over_inputs_gib")
                 for p in ("fused_lean", "liger") if (found := record.select(provider=p, mode="full", mask="none", **shape))}
        liger = peaks.get("liger")
        rows.append({**shape, "fused_gib": fused["peak_over_inputs_gib"], "fused_lean_gib": peaks.get("fused_lean"),
                     "liger_gib": liger, "fused_over_liger": fused["peak_over_inputs_gib"] / liger if liger else None})
    return sorted(rows, key=lambda r: (r["seq"], r["batch"]))


def kernel_rows(record: BenchRecord) -> list[dict]:
    """What the sweeps say about the row kernels, the fp32 dW accumulation and the small per-call ops."""
    rows = []
    for kernel in ("stats", "grads"):
        if best := best_row_kernel(record, kernel):
            rows.append({"quantity": f"row kernel '{kernel}', best bandwidth", "value": best["gbps"] / 1e3, "unit": "TB/s",
                         "setting": f"BLOCK_V={best['block_v']}, num_warps={best['num_warps']}"})
    fp32, dtype = stage_ms(record, "dW GEMM (fp32 accumulate)"), stage_ms(record, "dW GEMM (weight dtype out)")
    if fp32 and dtype:
        chunk = (record.sweeps.get("stages") or [{}])[0].get("chunk_rows")
        rows.append({"quantity": "fp32 dW accumulation over a weight-dtype dW GEMM", "value": fp32 - dtype, "unit": "ms",
                     "setting": f"per {chunk}-row chunk"})
    kinds = {k["kind"]: k for k in profile_summary(record.sweeps.get("profile") or [])}
    if small := kinds.get("small torch ops"):
        rows.append({"quantity": "small torch kernels in one forward+backward", "value": small["device_ms"], "unit": "ms",
                     "setting": f"{small['calls']} launches of {small['kernels']} kinds, {small['share_pct']:.1f}% of device time"})
    return rows


def mask_summary(record: BenchRecord) -> list[dict]:
    """Per workload and mask other than "none": each provider's time over the unmasked floor of the same run."""
    table: dict = {}
    for r in mask_rows(record, providers=("fused", "baseline", "liger")):
        if r["mask"] != "none":
            table.setdefault((r["batch"], r["seq"], r["mask"]), {})[f"{r['provider']}_x_unmasked_floor"] = r["x_unmasked_floor"]
    return [{"batch": b, "seq": t, "mask": m, **ratios} for (b, t, m), ratios in sorted(table.items())]


def latest_shapes_record(preset: str, data_dir: str | Path | None = None) -> BenchRecord | None:
    """The newest record of a named workload set of the benchmark (``--shapes long-context`` or
    ``small-models``), saved as ``shapes-<date>-<gpu>-<commit>-<preset>.json``."""
    return latest_bench_record(data_dir, pattern=f"shapes-*-{preset}.json")


def workload_rows(record: BenchRecord, *, mode: str, providers: tuple[str, ...] = ("baseline", "liger", "fused")) -> list[dict]:
    """One row per workload and mask of a record in ``mode``: the floor's median ms (same run) and each
    provider's ratio to it and peak over the inputs (GiB), as ``floor_ratios`` pairs them."""
    table: dict = {}
    masks = sorted({r.get("mask", "none") for r in record.results}, key=lambda m: (m != "none", m))
    for mask in masks:
        for provider in providers:
            for r in floor_ratios(record, mode=mode, provider=provider, mask=mask):
                shape = {k: r[k] for k in ("batch", "seq", "hidden", "vocab")}
                (run,) = record.select(provider=provider, mode=mode, mask=mask, **shape)
                row = table.setdefault((*shape.values(), mask), {**shape, "mask": mask, "mode": mode, "floor_ms": r["floor_ms"]})
                row[f"{provider}_x_floor"] = r["x_floor"]
                row[f"{provider}_gib"] = run.get("peak_over_inputs_gib")
    return [table[key] for key in sorted(table, key=lambda k: (k[4] != "none", k[4], k[1], k[2], k[3], k[0]))]


NO_GPU_NOTEBOOKS_MESSAGE = (
    "No GPU execution of the workbook in figures/data yet: its values appear once "
    "`python -m orpo_lib.workbook.gpu_notebooks` has run on a GPU machine and its notebooks-*.json is committed."
)


def latest_gpu_notebooks(data_dir: str | Path | None = None) -> dict | None:
    """The newest ``notebooks-<date>-<gpu>.json`` (every notebook executed on a GPU with ``run_gpu=True``):
    ``{"provenance": ..., "notebooks": {stem: {"seconds": ..., "record": {...}}}, "source": file name}``."""
    return latest_record("notebooks-*.json", data_dir)


def gpu_run_value(stem: str, name: str, data_dir: str | Path | None = None) -> tuple[str, object] | None:
    """What notebook ``stem`` recorded under ``name`` in the newest GPU execution of the workbook, with that
    run's provenance caption; None when there is no such execution."""
    run = latest_gpu_notebooks(data_dir)
    if run is None or stem not in run["notebooks"]:
        return None
    return provenance_caption(run["provenance"], run["source"]), run["notebooks"][stem]["record"].get(name)


def beside_gpu_run(recorded: list[dict], executed: list[dict], keys: list[str], values: list[str]) -> list[dict]:
    """Recorded rows joined on ``keys`` with the rows a GPU execution of the notebook measured: each of
    ``values`` twice, as ``recorded_<value>`` and ``gpu_run_<value>`` (None where one side lacks the row)."""
    def key(row):
        return tuple(row.get(k) for k in keys)

    by_key = {key(r): {k: r.get(k) for k in keys} for r in [*recorded, *executed]}
    for prefix, rows in (("recorded", recorded), ("gpu_run", executed)):
        for r in rows:
            by_key[key(r)].update({f"{prefix}_{v}": r.get(v) for v in values})
    return [by_key[k] for k in sorted(by_key, key=lambda k: tuple(str(v) for v in k))]


def latest_record(pattern: str, data_dir: str | Path | None = None) -> dict | None:
    """The newest JSON record in ``figures/data`` whose name matches ``pattern`` (dated names sort by date),
    with its file name as ``source``; None when there is none."""
    directory = Path(data_dir) if data_dir else DATA_DIR
    paths = sorted(directory.glob(pattern))
    return {**json.loads(paths[-1].read_text()), "source": paths[-1].name} if paths else None


# Columns of the statistics-GEMM probe: (label, time key, the time it is divided by).
STATS_GEMM_COLUMNS = [
    ("gluon_gemm", "gluon_mm_ms", "cublas_mm_ms"),
    ("cublas+row_stats", "mm_plus_row_stats_ms", "cublas_mm_ms"),
    ("stats_gemm_1wg", "stats_wg1_s16_ms", "cublas_mm_ms"),
    ("stats_gemm", "stats_wg2_s16_ms", "cublas_mm_ms"),
    ("stats_gemm_unbranched", "stats_wg2_s16_all_ms", "cublas_mm_ms"),
    ("stats_gemm+store", "stats_wg2_s16_store_ms", "mm_plus_row_stats_ms"),
]


def statistics_gemm_rows(record: dict) -> list[dict]:
    """Per (rows, H, V) of a ``stats-gemm-*.json`` probe: each variant's time over cuBLAS's logits GEMM, and
    the statistics GEMM that also stores the logits over cuBLAS + row_stats (what it would replace in training)."""
    return [{"rows": r["rows"], "hidden": r["hidden"], "vocab": r["vocab"], "cublas_ms": r["cublas_mm_ms"],
             **{label: r[key] / r[base] for label, key, base in STATS_GEMM_COLUMNS}} for r in record["results"]]


# Variants of the ping-pong statistics GEMM probe (pingpong-stats-*.json), each over cuBLAS's logits GEMM alone;
# its second run (pingpong-diagnostics-*.json) adds the warp-specialised skeleton and two variants of the kernel.
PINGPONG_COLUMNS = ("cublas_stats", "gluon_now", "pingpong4", "pingpong5", "pingpong6")
PINGPONG_DIAGNOSTIC_COLUMNS = ("cublas_stats", "gluon_gemm", "pingpong4", "pingpong5", "pp4_late_turn", "pp4_no_stats")


def pingpong_rows(record: dict, columns=PINGPONG_COLUMNS) -> list[dict]:
    """Per (rows, H, V) of a ping-pong probe: the variants in ``columns`` (by default cuBLAS + row_stats,
    ``gluon_row_stats`` and the ping-pong statistics GEMM at three ring depths), each over cuBLAS's logits GEMM in
    the same run."""
    return [{"rows": r["rows"], "hidden": r["hidden"], "vocab": r["vocab"],
             **{name: r["x_cublas"][name] for name in columns}} for r in record["results"]]


# Columns of the softmax-beside-the-MMAs probe: (label, time key), each over cuBLAS's dX GEMM in the same run.
SOFTMAX_MM_COLUMNS = [
    ("skeleton", "three_rings_no_transform_ms"),
    ("round_trip", "three_rings_no_exp_ms"),
    ("three_rings", "three_rings_ms"),
    ("softmax_mm", "softmax_mm_ms"),
]


def softmax_mm_rows(record: dict) -> list[dict]:
    """Per (rows, H, V) of a ``softmax-mm-*.json`` probe, over cuBLAS's dX GEMM: the break-even (that GEMM plus
    the half of row_grads the kernel saves, its write of G) and each variant's time."""
    return [{"rows": r["rows"], "hidden": r["hidden"], "vocab": r["vocab"], "cublas_dx_ms": r["cublas_dx_ms"],
             "break_even": 1 + r["half_row_grads_ms"] / r["cublas_dx_ms"],
             **{label: r[key] / r["cublas_dx_ms"] for label, key in SOFTMAX_MM_COLUMNS}} for r in record["results"]]


LAYOUT_STEPS = ("logits_gemm", "row_stats", "row_grads", "dx_gemm", "dw_gemm")


def layout_rows(record: dict) -> list[dict]:
    """Per shape of an ``aligned-rows-*.json`` record (an odd vocabulary): each step's time with the rows packed
    back to back and with the library's layout (rows padded to 16 columns, W with zero rows to match), and the
    copy of W that layout costs a call."""
    return [{"shape": f"{r['rows']}×{r['hidden']}×{r['vocab']}", "head_copy_ms": r["head_copy_ms"],
             **{f"{step}_{layout}": r[layout][f"{step}_ms"] for step in LAYOUT_STEPS for layout in ("packed", "padded")}}
            for r in record["results"]]


def small_call_rows(record: dict) -> list[dict]:
    """Per shape of a ``small-call-stalls-*.json`` record: each variant's median over the floor's in the same
    run, with the GPU idle at the call's start (as the harness times) and busy (after a GEMM standing in for
    the model, as in training)."""
    floors = {(r["shape"], r["scenario"]): r["median_ms"] for r in record["results"] if r["variant"] == "floor"}
    rows = {}
    for r in record["results"]:
        if r["variant"] != "floor":
            row = rows.setdefault(r["shape"], {"gpu": record["provenance"]["gpu"], "shape": r["shape"]})
            row[f"{r['variant']}_{r['scenario']}"] = r["median_ms"] / floors[r["shape"], r["scenario"]]
    return list(rows.values())


def before_after_rows(record: BenchRecord, mode: str = "eval") -> list[dict]:
    """Per shape (and mask) of a record run with ``--before``: the loss's time in ``mode`` over the floor's (in eval
    mode the logits GEMM) and its peak over the inputs, for this commit (``fused``) and the one before (``before``)."""
    rows = []
    for floor in record.select("floor", mode):
        shape = {k: floor[k] for k in ("batch", "seq", "hidden", "vocab", "mask") if k in floor}
        now, before = (record.select(p, mode, **shape) for p in ("fused", "before"))
        if now and before:
            rows.append({**shape, "fused": now[0]["median_ms"] / floor["median_ms"],
                         "before": before[0]["median_ms"] / floor["median_ms"],
                         "fused_peak_gib": now[0]["peak_over_inputs_gib"],
                         "before_peak_gib": before[0]["peak_over_inputs_gib"]})
    return rows


def busy_idle_rows(pattern: str, mode: str = "full", data_dir: str | Path | None = None) -> tuple[list[dict], list[str]]:
    """``before_after_rows`` of the busy and the idle record of one A/B run (``pattern``, a glob with a ``{scenario}``
    field), each row marked with its scenario, and the caption of each record found."""
    rows, captions = [], []
    for scenario in ("busy", "idle"):
        record = latest_bench_record(data_dir, pattern=pattern.format(scenario=scenario))
        if record is not None:
            captions.append(f"{scenario}: {record_caption(record)}")
            rows += [{"scenario": scenario, **row} for row in before_after_rows(record, mode)]
    return rows, captions


def trl_training_rows(record: dict) -> list[dict]:
    """Per (model, seq, pairs) of a ``trl-training-*.json`` record (``python -m orpo_lib.workbook.trl_bench``): stock
    ORPOTrainer's and FusedORPOTrainer's median step and peak memory side by side, the fused trainer's speed-up in
    tokens/s, and the largest batch of pairs each trained (None where a trainer did not fit the row)."""
    by_key = {}
    for r in record["rows"]:
        row = by_key.setdefault((r["model"], r["seq"], r["pairs"]), {"model": r["model"], "seq": r["seq"],
                                                                      "pairs": r["pairs"]})
        row.update({f"{r['trainer']}_ms": r["median_step_ms"], f"{r['trainer']}_tokens_per_s": r["tokens_per_s"],
                    f"{r['trainer']}_gib": r["peak_gib"], f"{r['trainer']}_max_pairs": r["max_pairs"]})
    rows = list(by_key.values())
    for row in rows:
        stock, fused = row.get("stock_tokens_per_s"), row.get("fused_tokens_per_s")
        row["fused_speedup"] = fused / stock if stock and fused else None
    return rows
