"""The README's two tables, generated from the records in figures/data, so that they cannot drift from them:

    python -m orpo_lib.workbook.readme            # print them
    python -m orpo_lib.workbook.readme --write    # put them into README.md between their markers

The performance table reads the newest ``seed-shapes``, ``small-models`` and ``long-context`` records, the
training table the newest ``trl-training`` record (``python -m orpo_lib.workbook.records`` writes them all).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from .measurements import BenchRecord, floor_mode, latest_bench_record, latest_record, shape_text, trl_training_rows

README = Path(__file__).resolve().parents[2] / "README.md"
PERFORMANCE_PARTS = ("seed-shapes", "small-models", "long-context")
# column heading → provider, in the full (forward + backward) mode
PROVIDER_COLUMNS = {"fused": "fused", "Liger": "liger", "baseline (TRL-style)": "baseline",
                    "baseline, compiled": "baseline_compiled"}


def _gib(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _cell(record: BenchRecord, provider: str, mode: str, shape: dict, floor_ms: float, with_memory: bool = True) -> str:
    found = record.select(provider=provider, mode=mode, status=None, mask="none", **shape)
    if not found:
        return "—"
    result = found[0]
    if result.get("status", "ok") != "ok":
        return "out of memory" if result["status"] == "oom" else result["status"]
    ratio = f"{result['median_ms'] / floor_ms:.2f}×"
    return f"{ratio} · {_gib(result['peak_over_inputs_gib'])} GiB" if with_memory else ratio


def _shape_label(shape: dict, seed: dict) -> str:
    label = shape_text(shape)
    if (shape["hidden"], shape["vocab"]) != (seed["hidden"], seed["vocab"]):
        label += f", H={shape['hidden']}, V={shape['vocab'] // 1000}K"
    return label


def performance_table(records: list[BenchRecord]) -> str:
    """One row per workload (every token counted): the floor's ms, each provider's forward + backward time over
    it and peak over the inputs, and the fused loss without gradients over the logits GEMM."""
    seed = {k: records[0].results[0][k] for k in ("hidden", "vocab")}
    measured = {r["provider"] for record in records for r in record.results}
    columns = {head: p for head, p in PROVIDER_COLUMNS.items() if p in measured}
    head = ["B×T", "floor", *columns, "fused, no grad"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for record in records:
        shapes = dict.fromkeys((r["batch"], r["seq"], r["hidden"], r["vocab"])
                               for r in record.select(provider="floor", mode="full", mask="none"))
        for batch, seq, hidden, vocab in shapes:
            shape = {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab}
            floor_ms = record.select(provider="floor", mode="full", mask="none", **shape)[0]["median_ms"]
            eval_floor = record.select(provider="floor", mode=floor_mode("eval"), mask="none", **shape)
            no_grad = _cell(record, "fused", "eval", shape, eval_floor[0]["median_ms"], False) if eval_floor else "—"
            cells = [_shape_label(shape, seed), f"{floor_ms:.3g} ms",
                     *(_cell(record, p, "full", shape, floor_ms) for p in columns.values()), no_grad]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def training_table(record: dict) -> str:
    """Per model, its smallest and largest step (sequence length × pairs): both trainers' median step and peak
    memory, the fused trainer's tokens/s over stock's, and the most pairs each trained at the longest sequence."""
    head = ["model (H, V)", "T × pairs", "stock ms", "fused ms", "fused tokens/s", "stock GiB", "fused GiB",
            "most pairs, stock / fused"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    models, seen = record["models"], set()
    cap = record["settings"].get("max_pairs_cap")  # where the search stops: a batch there may not be the most

    def most(n):
        return "—" if n is None else (f"≥{n}" if n == cap else str(n))

    rows = trl_training_rows(record)
    for model in dict.fromkeys(r["model"] for r in rows):  # each model's smallest and largest step
        own = [r for r in rows if r["model"] == model]
        keep = {id(min(own, key=lambda r: (r["seq"], r["pairs"]))), id(max(own, key=lambda r: (r["seq"], r["pairs"])))}
        rows = [r for r in rows if r["model"] != model or id(r) in keep]
    for row in rows:
        config = models[row["model"]]
        name = "" if row["model"] in seen else f"{row['model']} ({config['hidden_size']}, {config['vocab_size']})"
        first = row["model"] not in seen
        seen.add(row["model"])
        speedup = f"{row['fused_speedup']:.2f}×" if row["fused_speedup"] else "—"
        pairs = f"{most(row['stock_max_pairs'])} / {most(row['fused_max_pairs'])}" if first else ""
        lines.append(f"| {name} | {row['seq']} × {row['pairs']} | {row['stock_ms']:.0f} | {row['fused_ms']:.0f} | "
                     f"{speedup} | {row['stock_gib']:.1f} | {row['fused_gib']:.1f} | {pairs} |")
    return "\n".join(lines)


def caption(provenance: dict, when: str | None = None) -> str:
    """The card, versions and date(s) a table comes from (the commit is in its records)."""
    when = when or str(provenance["date"])[:10]
    return f"{provenance['gpu']}, torch {provenance['torch']}, triton {provenance['triton']}, {when}"


def tables(data_dir: str | Path | None = None) -> dict[str, str]:
    """Marker name → the generated block (caption line, blank line, table)."""
    records = [latest_bench_record(data_dir, pattern=f"{part}-*.json") for part in PERFORMANCE_PARTS]
    records = [r for r in records if r is not None]
    trl = latest_record("trl-training-*.json", data_dir)
    out = {}
    if records:
        gpus = {r.provenance["gpu"] for r in records}
        assert len(gpus) == 1, f"the performance table mixes cards: {sorted(gpus)}"
        dates = sorted(str(r.provenance["date"])[:10] for r in records)
        when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        out["performance"] = (f"Measured on one {caption(records[0].provenance, when)}"
                              f" ({', '.join(r.source for r in records)}).\n\n" + performance_table(records))
    if trl is not None:
        out["training"] = f"Measured on one {caption(trl['provenance'])} ({trl['source']}).\n\n" + training_table(trl)
    return out


def with_tables(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each ``<!-- name table -->`` … ``<!-- end name table -->`` block replaced."""
    for name, block in blocks.items():
        pattern = re.compile(rf"(<!-- {name} table -->\n)(?:.*?\n)?(<!-- end {name} table -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"README has no <!-- {name} table --> … <!-- end {name} table --> markers")
        text = pattern.sub(lambda m: m.group(1) + block + "\n" + m.group(2), text)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="update README.md in place")
    args = parser.parse_args(argv)
    blocks = tables()
    if args.write:
        README.write_text(with_tables(README.read_text(), blocks))
    else:
        print("\n\n".join(blocks.values()))


if __name__ == "__main__":
    main()
