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
    "`python -m orpo_lib.workbook.records` has run on a GPU machine and its records are committed."
)


# The seed workloads with notebook 4's sweeps, from one run of the harness on one GPU (``seed-shapes-<gpu>.json``).
SEED_RECORD_PATTERN = "seed-shapes-*.json"
NO_SEED_RECORD_MESSAGE = (
    "No seed-shapes record in figures/data yet: the measured numbers appear once the harness has run the seed "
    "shapes and their sweeps on a GPU (the seed-shapes part of `python -m orpo_lib.workbook.records`) and its "
    "seed-shapes-<gpu>.json is committed."
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


def load_bench_records(data_dir: str | Path | None = None, pattern: str = SEED_RECORD_PATTERN) -> list[BenchRecord]:
    """Every benchmark record in ``data_dir`` (default ``figures/data``): CPU runs first, then GPU runs, oldest first."""
    directory = Path(data_dir) if data_dir else DATA_DIR
    records = [load_bench_record(p) for p in sorted(directory.glob(pattern))]
    return sorted(records, key=lambda r: (is_gpu_record(r), str(r.provenance.get("date", "")), r.source))


def latest_bench_record(data_dir: str | Path | None = None, pattern: str = SEED_RECORD_PATTERN) -> BenchRecord | None:
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


def latest_seed_record(data_dir: str | Path | None = None) -> BenchRecord | None:
    """The newest seed-shapes record (``SEED_RECORD_PATTERN``) in ``data_dir`` (default ``figures/data``), or None."""
    return latest_bench_record(data_dir, pattern=SEED_RECORD_PATTERN)


def measured_on(record: BenchRecord) -> str:
    """The sentence that names the one GPU (and run) every measured number of a notebook comes from."""
    gpu = record.provenance.get("gpu") or "unknown GPU"
    return (f"Every measured number below comes from one run on one GPU, {gpu}: "
            f"{record_caption(record).removeprefix(gpu + ', ')}.")


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


def row_kernel_point(record: BenchRecord, kernel: str, block_v: int, num_warps: int) -> dict | None:
    """The recorded point of one row kernel at one launch configuration (the library's: ``kernels.STATS_LAUNCH``,
    ``kernels.GRADS_LAUNCH``), or None when the sweep did not try it."""
    found = [p for p in record.sweeps.get("row_kernel") or []
             if (p["kernel"], p["block_v"], p["num_warps"]) == (kernel, block_v, num_warps)]
    return found[0] if found else None


def stage_ms(record: BenchRecord, stage: str) -> float | None:
    """Median milliseconds of one recorded stage, or None when the stages sweep lacks it."""
    found = [s["median_ms"] for s in record.sweeps.get("stages") or [] if s["stage"] == stage]
    return found[0] if found else None


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
# and Liger's ORPO loss, against which the memory model's seed baseline is tested.
def _anchor_record(name: str) -> BenchRecord:
    """A record in ``figures/data``, or an empty one where the package runs without the repository's data."""
    path = DATA_DIR / name
    return load_bench_record(path) if path.exists() else BenchRecord({}, [], source=f"{name} (not found)")


H200_ANCHORS = _anchor_record("anchors-2026-12-02-h200.json")


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


# The paths of the statistics-GEMM sweep (``bench.stats_gemm_sweep``): cuBLAS's logits GEMM alone, the same GEMM
# then row_stats over its buffer, and the Gluon statistics GEMM, which stores no logits.
STATS_GEMM_PATHS = ("cublas_mm", "cublas_row_stats", "stats_gemm")


def _over(ms: float | None, base: float | None) -> float | None:
    return ms / base if ms is not None and base else None


def _against(row: dict, path: str, other: str) -> str | None:
    """"faster" or "slower" where the two paths' min-max ranges do not overlap, else "level"; None unless both ran."""
    if row.get(f"{path}_ms") is None or row.get(f"{other}_ms") is None:
        return None
    if row[f"{path}_max_ms"] < row[f"{other}_min_ms"]:
        return "faster"
    return "slower" if row[f"{path}_min_ms"] > row[f"{other}_max_ms"] else "level"


def stats_gemm_rows(record: BenchRecord) -> list[dict]:
    """Per shape of the record's ``stats_gemm`` sweep: cuBLAS's logits GEMM alone (ms); the buffer path and the
    statistics GEMM over it (``*_x_mm``, with each one's fastest and slowest repetition over the same median); the
    statistics GEMM over the buffer path and how the two compare ("faster", "slower", or "level" where their
    min-max ranges overlap); the GB of logits written and read back that the statistics GEMM does not move; the
    largest differences of its statistics from the buffer path's; whether the library's rule took a no-grad call
    of that many rows through it on the record's GPU; and the row's status ("unsupported": no Gluon kernel there)."""
    rows = []
    for r in record.sweeps.get("stats_gemm") or []:
        mm = r.get("cublas_mm_ms")
        moved = {p: r[f"{p}_written_bytes"] + r[f"{p}_read_bytes"] for p in STATS_GEMM_PATHS}
        row = {"rows": r["rows"], "hidden": r["hidden"], "vocab": r["vocab"], "cublas_mm_ms": mm}
        for path, name in (("cublas_row_stats", "row_stats"), ("stats_gemm", "stats_gemm")):
            row[f"{name}_x_mm"] = _over(r.get(f"{path}_ms"), mm)
            row[f"{name}_x_mm_min"], row[f"{name}_x_mm_max"] = (_over(r.get(f"{path}_{s}_ms"), mm) for s in ("min", "max"))
        rows.append({**row, "stats_gemm_x_row_stats": _over(r.get("stats_gemm_ms"), r.get("cublas_row_stats_ms")),
                     "against_row_stats": _against(r, "stats_gemm", "cublas_row_stats"),
                     "gb_not_moved": (moved["cublas_row_stats"] - moved["stats_gemm"]) / 1e9,
                     "lse_max_abs_diff": r.get("lse_max_abs_diff"), "logp_max_abs_diff": r.get("logp_max_abs_diff"),
                     "in_library": r["in_library"], "status": r["status"]})
    return rows


def stats_gemm_verdict(rows: list[dict]) -> dict:
    """What ``stats_gemm_rows`` say about the library's rule on their GPU: the shapes where the statistics GEMM
    measured faster or level against the buffer path, those where the rule takes it, and those where the two
    differ (each shape as "rows×H×V")."""
    def shape(r):
        return f"{r['rows']}×{r['hidden']}×{r['vocab']}"

    measured = [r for r in rows if r["against_row_stats"] is not None]
    worth_it = {shape(r) for r in measured if r["against_row_stats"] in ("faster", "level")}
    taken = {shape(r) for r in measured if r["in_library"]}
    return {"shapes": len(rows), "measured": len(measured), "faster_or_level": sorted(worth_it),
            "in_library": sorted(taken), "differ": sorted(worth_it ^ taken)}


# The gradient inside the GEMMs: each Gluon GEMM that forms G as it loads the logits within this factor of the same
# cuBLAS GEMM over a buffer that already holds G: 3 % at H = 4096, 8 % at smaller H.
GRAD_GEMM_TARGETS = {4096: 1.03, 0: 1.08}


def grad_gemm_target(hidden: int) -> float:
    """The target of ``gluon_dx`` and ``gluon_dw`` over cuBLAS's GEMM at this hidden size (``GRAD_GEMM_TARGETS``)."""
    return GRAD_GEMM_TARGETS[4096] if hidden >= 4096 else GRAD_GEMM_TARGETS[0]


def grad_gemm_rows(record: BenchRecord) -> list[dict]:
    """Per shape of the record's ``grad_gemm`` sweep (``workbook.grad_gemm``): cuBLAS's dX and dW GEMMs over G (ms);
    each Gluon GEMM over its cuBLAS one, the target and whether it meets it; the row_grads pass over the two cuBLAS
    GEMMs; both gradients' paths together, the buffer path's and the Gluon one's, over the two cuBLAS GEMMs, and how
    the two compare ("faster", "slower", "level"); the relative errors against float64; whether the Gluon GEMMs
    repeat bitwise; the row's status."""
    rows = []
    for r in record.sweeps.get("grad_gemm") or []:
        dx, dw = r.get("cublas_dx_ms"), r.get("cublas_dw_ms")
        gemms = dx + dw if dx and dw else None
        target = grad_gemm_target(r["hidden"])
        row = {"rows": r["rows"], "hidden": r["hidden"], "vocab": r["vocab"], "cublas_dx_ms": dx, "cublas_dw_ms": dw,
               "gluon_dx_x_cublas": _over(r.get("gluon_dx_ms"), dx), "gluon_dw_x_cublas": _over(r.get("gluon_dw_ms"), dw),
               "target_x_cublas": target, "row_grads_x_gemms": _over(r.get("row_grads_ms"), gemms),
               "buffer_x_gemms": _over(r.get("buffer_ms"), gemms), "gluon_x_gemms": _over(r.get("gluon_ms"), gemms),
               "against_buffer": _against(r, "gluon", "buffer")}
        ratios = [row["gluon_dx_x_cublas"], row["gluon_dw_x_cublas"]]
        row["meets_target"] = None if None in ratios else max(ratios) <= target
        rows.append({**row, **{f"{p}_{g}_rel_err": r.get(f"{p}_{g}_rel_err") for p in ("buffer", "gluon")
                               for g in ("dx", "dw")},
                     "bitwise_repeatable": r.get("bitwise_repeatable"), "status": r["status"]})
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
    ``small-models``), saved as ``<preset>-<gpu>.json`` by ``python -m orpo_lib.workbook.records``."""
    return latest_bench_record(data_dir, pattern=f"{preset}-*.json")


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


def latest_record(pattern: str, data_dir: str | Path | None = None) -> dict | None:
    """The newest JSON record in ``figures/data`` whose name matches ``pattern`` (by the date in its provenance,
    then its name), with its file name as ``source``; None when there is none."""
    directory = Path(data_dir) if data_dir else DATA_DIR
    records = [{**json.loads(p.read_text()), "source": p.name} for p in sorted(directory.glob(pattern))]
    return max(records, key=lambda r: (str(r.get("provenance", {}).get("date", "")), r["source"])) if records else None


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
