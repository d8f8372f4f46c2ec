"""TRL's ``ORPOTrainer`` and ``FusedORPOTrainer`` trained side by side: step time, tokens/s, peak memory, max pairs.

    python -m orpo_lib.workbook.trl_bench [--models qwen2.5-0.5b,llama-3.2-1b,mistral-7b-cut,llama-3-8b-cut]
                                          [--seqs 1024,2048] [--pairs 2,4,8] [--steps 5] [--warmup 2] [--out PATH]

Models have random weights, built from configs shaped like the checkpoints they are named after (nothing is
downloaded); ``mistral-7b-cut`` and ``llama-3-8b-cut`` keep 4 of their 32 decoder layers and their whole embedding
and LM head. Precision is what a TRL user on one GPU gets with transformers 5, the same for both trainers: weights
in bf16 (``from_pretrained``'s default ``dtype="auto"`` for a bf16 checkpoint), ``ORPOConfig(bf16=True,
gradient_checkpointing=True)`` (ORPOConfig's own defaults; the bench passes ``activation_checkpointing=True``, the
option's name in transformers 5.24), transformers' default optimizer (fused AdamW, on the bf16 weights),
``attn_implementation="sdpa"``.

Data: prompt, chosen and rejected of random words of a word-level tokenizer whose vocabulary is the model's V.
One answer of each pair runs past max_length T (TRL cuts it at T) and the other stops 0-25 % short, so every
batch pads to T (one shape for every step: no recompilation while timing) and ~5 % of a batch is padding.

Each row (model, seq, pairs, trainer) builds its model afresh from seed 0 on the device, so both trainers start
from the same weights and nothing of one row outlives it, and a data set of exactly pairs × (warm-up + timed
steps) pairs: one epoch is the run, and TRL's seeded sampler gives both trainers the same rows in the same order.
One ``trainer.train()`` runs the warm-up and the timed steps; a callback drains the GPU queue at each
``on_step_begin`` and ``on_step_end`` and takes the wall time between: the trainer's own step (forward, backward,
clipping, optimizer step, zero_grad), not the collation before it nor the logging after it.

* ``median_step_ms`` (with min and max) over the timed steps;
* ``tokens_per_s``: the non-padding tokens of a step (chosen + rejected, the mean over the run's rows) over the
  median step time;
* ``peak_gib``: ``torch.cuda.max_memory_allocated`` over the row, reset once the previous row is freed: weights,
  gradients, optimizer state, activations and logits;
* ``max_pairs``, at the largest seq: the largest pairs per step that trains one step without running out of
  memory, doubling from the largest --pairs to --max-pairs-cap and stopping at the first failure (a lower bound
  within a factor of 2);
* ``losses``, ``final_loss``: the losses the trainer logged (one a step), to show both trained the same thing.

A row that runs out of memory has ``status`` "oom" and no numbers; one that fails otherwise, "error" and the
message: neither ends the run, and the record is written after each model, so a run cut short keeps what it measured.

Without CUDA it runs a tiny Llama on the CPU (the fused loss through the Triton interpreter, in float32), with no
peak memory and no max_pairs search (the CPU has no out-of-memory error to find).
"""

import argparse
import datetime
import functools
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import accelerate
import datasets
import torch
import transformers
import trl
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
from trl.experimental.orpo import ORPOConfig, ORPOTrainer

from . import bench
from ..trl import FusedORPOTrainer

TRAINERS = {"stock": ORPOTrainer, "fused": FusedORPOTrainer}
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0-3, as the configs below name them
# name -> (config class, shape); RoPE and norm settings stay at the config's defaults: they change no cost.
MODELS = {
    "qwen2.5-0.5b": (transformers.Qwen2Config, dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, tie_word_embeddings=True)),
    "llama-3.2-1b": (transformers.LlamaConfig, dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, tie_word_embeddings=True)),
    "mistral-7b-cut": (transformers.MistralConfig, dict(  # Mistral-7B-v0.3: no sliding window
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=32000, tie_word_embeddings=False, sliding_window=None)),
    "llama-3-8b-cut": (transformers.LlamaConfig, dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, tie_word_embeddings=False)),
    "tiny-llama": (transformers.LlamaConfig, dict(  # the CPU's run
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=131, tie_word_embeddings=False)),
}
GPU_DEFAULTS = dict(models="qwen2.5-0.5b,llama-3.2-1b,mistral-7b-cut,llama-3-8b-cut", seqs="1024,2048",
                    pairs="2,4,8", steps=5, warmup=2)
CPU_DEFAULTS = dict(models="tiny-llama", seqs="24", pairs="2", steps=2, warmup=1)
MEASURED = ("median_step_ms", "min_step_ms", "max_step_ms", "tokens_per_step", "tokens_per_s", "peak_gib",
            "final_loss", "losses")
GIB = 1 << 30


def build_model(name: str, device):
    """The named model with random weights from seed 0, made on ``device`` (bf16 on a GPU, float32 on the CPU,
    where the Triton interpreter computes bf16 wrongly)."""
    config_class, shape = MODELS[name]
    config = config_class(**shape, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


@functools.cache
def word_tokenizer(vocab: int):
    """A word-level tokenizer of ``vocab`` entries, made here: the special tokens, then the words w4, w5, ..."""
    words = (*SPECIAL_TOKENS, *(f"w{i}" for i in range(len(SPECIAL_TOKENS), vocab)))
    tok = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>")


def preference_data(vocab: int, seq: int, rows: int, seed=1):
    """``rows`` pairs of random words: a prompt of T/8 to T/4 words, one answer longer than the room left (TRL cuts
    it at T) and the other 75-100 % of the room, chosen or rejected at random."""
    gen = torch.Generator().manual_seed(seed)

    def words(n):
        return " ".join(f"w{i}" for i in torch.randint(len(SPECIAL_TOKENS), vocab, (n,), generator=gen).tolist())

    columns = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(rows):
        prompt = int(torch.randint(seq // 8, seq // 4 + 1, (1,), generator=gen))
        room = seq - prompt - 2  # TRL adds BOS to the prompt and EOS to each answer
        answers = [seq, int(room * (0.75 + 0.25 * torch.rand(1, generator=gen).item()))]
        if torch.rand(1, generator=gen).item() < 0.5:
            answers.reverse()
        columns["prompt"].append(words(prompt))
        # the leading space keeps the prompt's last word and the answer's first apart when TRL joins them
        columns["chosen"].append(" " + words(answers[0]))
        columns["rejected"].append(" " + words(answers[1]))
    return datasets.Dataset.from_dict(columns)


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, the GPU's queue drained at both ends."""

    def __init__(self, device):
        self.device, self.seconds = device, []

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        self.seconds.append(time.perf_counter() - self.start)


def make_trainer(trainer: str, model, data, *, pairs: int, seq: int, steps: int, device, output_dir, callbacks):
    on_gpu = device.type == "cuda"
    args = ORPOConfig(output_dir=output_dir, per_device_train_batch_size=pairs, max_length=seq, max_steps=steps,
                      bf16=on_gpu, activation_checkpointing=True, use_cpu=not on_gpu, logging_steps=1, seed=0,
                      save_strategy="no", report_to="none", dataloader_num_workers=0, remove_unused_columns=False,
                      disable_tqdm=True)
    run = TRAINERS[trainer](model=model, args=args, train_dataset=data, callbacks=callbacks,
                            processing_class=word_tokenizer(model.config.vocab_size))
    run.remove_callback(PrinterCallback)  # the bench prints one line a row, not the logs of every step
    return run


def non_padding_tokens(tokenized) -> int:
    """Tokens of every chosen and rejected sequence of TRL's tokenized data set, after its truncation."""
    return sum(len(ids) for column in ("chosen_input_ids", "rejected_input_ids") for ids in tokenized[column])


def train_and_time(model: str, trainer: str, pairs: int, seq: int, *, warmup: int, steps: int, device) -> dict:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timer = StepTimer(device)
    data = preference_data(MODELS[model][1]["vocab_size"], seq, pairs * (warmup + steps))
    with tempfile.TemporaryDirectory() as output_dir:
        run = make_trainer(trainer, build_model(model, device), data, pairs=pairs, seq=seq, steps=warmup + steps,
                           device=device, output_dir=output_dir, callbacks=[timer])
        run.train()
    timed = timer.seconds[warmup:]
    median_s = statistics.median(timed)
    tokens_per_step = non_padding_tokens(run.train_dataset) / (warmup + steps)
    losses = [entry["loss"] for entry in run.state.log_history if "loss" in entry]
    return dict(status="ok", median_step_ms=median_s * 1e3, min_step_ms=min(timed) * 1e3, max_step_ms=max(timed) * 1e3,
                tokens_per_step=tokens_per_step, tokens_per_s=tokens_per_step / median_s,
                peak_gib=torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
                final_loss=losses[-1], losses=losses)


def free_memory(device):
    gc.collect()  # the trainer, its accelerator and the model hold each other: only the collector frees them
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_row(model: str, trainer: str, pairs: int, seq: int, *, warmup: int, steps: int, device) -> dict:
    """One trainer on one model and shape, freed before it returns. ``status`` is "oom" where it ran out of
    memory, "error" (with the message) where anything else failed, so that one row cannot end the run."""
    row = dict(model=model, pairs=pairs, seq=seq, trainer=trainer, steps=steps, warmup=warmup, error=None)
    try:
        measured = train_and_time(model, trainer, pairs, seq, warmup=warmup, steps=steps, device=device)
    except torch.OutOfMemoryError:
        measured = dict(status="oom")  # leaving this block drops the traceback, and with it the step's tensors
    except Exception as e:  # noqa: BLE001 (recorded, and shown in the progress line)
        measured = dict(status="error", error=f"{type(e).__name__}: {e}"[:500])
    free_memory(device)
    return {**row, **dict.fromkeys(MEASURED), **measured}


def largest_fitting(fits, start: int, cap: int) -> int:
    """The largest of start, 2·start, 4·start, ... up to ``cap`` for which ``fits`` holds, trying them in turn
    and stopping at the first that does not (``start`` is known to fit)."""
    best = start
    while best * 2 <= cap and fits(best * 2):
        best *= 2
    return best


def describe(row) -> str:
    head = f"{row['model']} T={row['seq']} pairs={row['pairs']} {row['trainer']}"
    if row["status"] != "ok":
        return f"{head}: {'out of memory' if row['status'] == 'oom' else row['error']}"
    peak = f", peak {row['peak_gib']:.2f} GiB" if row["peak_gib"] is not None else ""
    return (f"{head}: {row['median_step_ms']:.1f} ms/step, {row['tokens_per_s']:.0f} tokens/s{peak}, "
            f"loss {row['losses'][0]:.4f} … {row['final_loss']:.4f}")


def model_rows(model: str, seqs, pairs_list, *, warmup: int, steps: int, max_pairs_cap: int, device) -> list:
    """Every (seq, pairs, trainer) row of one model, then each trainer's max_pairs on every row of it."""
    rows = []
    for seq in seqs:
        for pairs in pairs_list:
            for trainer in TRAINERS:
                rows.append(run_row(model, trainer, pairs, seq, warmup=warmup, steps=steps, device=device))
                print(describe(rows[-1]), flush=True)
    if device.type != "cuda" or max_pairs_cap <= 0:
        return [{**row, "max_pairs": None} for row in rows]

    def fits(trainer, pairs):
        row = run_row(model, trainer, pairs, max(seqs), warmup=0, steps=1, device=device)
        print(f"  max_pairs search, {describe(row)}", flush=True)
        return row["status"] == "ok"

    max_pairs = {}
    for trainer in TRAINERS:
        fitted = [r["pairs"] for r in rows if r["trainer"] == trainer and r["seq"] == max(seqs) and r["status"] == "ok"]
        if max(pairs_list) in fitted:
            max_pairs[trainer] = largest_fitting(functools.partial(fits, trainer), max(pairs_list), max_pairs_cap)
        else:  # the timed rows already ran out of memory: no search above them
            max_pairs[trainer] = max(fitted, default=0)
    return [{**row, "max_pairs": max_pairs[row["trainer"]]} for row in rows]


def summary_table(rows) -> str:
    """Stock against fused for each (model, seq, pairs): step times, the tokens/s ratio, peaks, final losses."""
    by_key = {(r["model"], r["seq"], r["pairs"], r["trainer"]): r for r in rows}
    # (heading, width, format, value of the stock and fused rows)
    columns = [("stock ms", 9, ".1f", lambda s, f: s["median_step_ms"]),
               ("fused ms", 9, ".1f", lambda s, f: f["median_step_ms"]),
               ("tok/s ×", 8, ".3f", lambda s, f: f["tokens_per_s"] / s["tokens_per_s"]
                if s["tokens_per_s"] and f["tokens_per_s"] else None),
               ("stock GiB", 9, ".2f", lambda s, f: s["peak_gib"]),
               ("fused GiB", 9, ".2f", lambda s, f: f["peak_gib"]),
               ("stock loss", 10, ".4f", lambda s, f: s["final_loss"]),
               ("fused loss", 10, ".4f", lambda s, f: f["final_loss"]),
               ("stock max", 9, "d", lambda s, f: s["max_pairs"]),
               ("fused max", 9, "d", lambda s, f: f["max_pairs"])]
    lines = [f"{'model':<15} {'T':>5} {'pairs':>5} " + " ".join(f"{head:>{width}}" for head, width, _, _ in columns)]
    for model, seq, pairs in dict.fromkeys((r["model"], r["seq"], r["pairs"]) for r in rows):
        stock, fused = by_key[model, seq, pairs, "stock"], by_key[model, seq, pairs, "fused"]
        cells = [(value(stock, fused), width, spec) for _, width, spec, value in columns]
        lines.append(f"{model:<15} {seq:>5} {pairs:>5} " + " ".join(
            f"{'-' if v is None else format(v, spec):>{width}}" for v, width, spec in cells))
    return "\n".join(lines)


def parse_args(argv, on_gpu):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(**(GPU_DEFAULTS if on_gpu else CPU_DEFAULTS))
    parser.add_argument("--models", help=f"comma-separated, of {','.join(MODELS)}")
    parser.add_argument("--seqs", help="max_length values, comma-separated")
    parser.add_argument("--pairs", help="pairs per step (per_device_train_batch_size), comma-separated")
    parser.add_argument("--steps", type=int, help="timed steps per row")
    parser.add_argument("--warmup", type=int, help="steps before the timed ones")
    parser.add_argument("--max-pairs-cap", type=int, default=64, help="the max_pairs search stops here (0: no search)")
    parser.add_argument("--out", default=None,
                        help="JSON record (default build/trl-training-<device>-<date>.json)")
    parser.add_argument("--commit", default=None)
    args = parser.parse_args(argv)
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}: expected some of {','.join(MODELS)}")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    args = parse_args(argv, on_gpu)
    datasets.disable_progress_bars()  # three bars a trainer, twice a row, would drown the bench's own lines
    names = args.models.split(",")
    seqs, pairs = ([int(n) for n in text.split(",")] for text in (args.seqs, args.pairs))
    command = "python -m orpo_lib.workbook.trl_bench " + " ".join(argv)
    versions = {package.__name__: package.__version__ for package in (transformers, trl, accelerate, datasets)}
    record = {"provenance": {**bench.provenance(device, command, args.commit), **versions},
              "settings": dict(weights="bf16" if on_gpu else "float32", bf16=on_gpu, activation_checkpointing=True,
                               attn_implementation="sdpa", warmup=args.warmup, steps=args.steps, max_pairs_cap=args.max_pairs_cap,
                               tokens_per_s="non-padding tokens per step / median step time",
                               peak_gib="torch.cuda.max_memory_allocated over the row"),
              "models": {name: {"config": MODELS[name][0].__name__, **MODELS[name][1]} for name in names},
              "rows": []}
    out = Path(args.out) if args.out else Path("build") / (
        f"trl-training-{bench.device_slug(device)}-{datetime.date.today().isoformat()}.json")
    for name in names:
        record["rows"] += model_rows(name, seqs, pairs, warmup=args.warmup, steps=args.steps,
                                     max_pairs_cap=args.max_pairs_cap, device=device)
        bench.write_json(out, record)  # after each model, so that a run cut short leaves what it measured
    print(summary_table(record["rows"]))
    print(f"record: {out}")
    return record


if __name__ == "__main__":
    main()
