"""One process of a two-process training run (``torchrun --nproc_per_node 2 trainer_layout_run.py LAYOUT OUT``):
stock ORPOTrainer and FusedORPOTrainer, each trained from the same seeded model on the same data in LAYOUT
(ddp, fsdp2, zero2 or zero3), plain and with a LoRA adapter and gradient accumulation. Rank 0 saves, per run, the logged
steps, what shows the layout was real, and the parameters after training, gathered whole."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: tiny_hf

import torch  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402
from peft import LoraConfig  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from trl.experimental.orpo import ORPOTrainer  # noqa: E402

from orpo_lib.trl import FusedORPOTrainer  # noqa: E402
from tiny_hf import HEADS, orpo_config, preference_data, tokenizer  # noqa: E402

_built = AcceleratorState.__init__


def _fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):
    # accelerate 1.16 drops an FSDP plugin on CPU processes (MULTI_CPU) and trains plain DDP without a word; FSDP2
    # itself runs on CPU over gloo, so the state is given back the plugin it was asked for.
    _built(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type, self.fsdp_plugin = DistributedType.FSDP, fsdp_plugin


AcceleratorState.__init__ = _fsdp_on_cpu

def zero(stage):
    return {"zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True},
            "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}


LAYOUTS = {"ddp": {}, "fsdp2": dict(fsdp="full_shard", fsdp_config={"fsdp_version": 2}),
           "zero2": dict(deepspeed=zero(2)), "zero3": dict(deepspeed=zero(3))}
CASES = {"plain": dict(accumulation=1, adapter=None),
         "lora-accumulation": dict(accumulation=2, adapter=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                                          target_modules=["q_proj", "v_proj"]))}


def model_after(args):
    """A tiny Llama built after its ORPOConfig, as from_pretrained builds one: under ZeRO-3 it is partitioned as it
    is made."""
    _, config_cls, options = HEADS["llama"]
    config = config_cls(vocab_size=124, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, **options)
    args.device  # (sets up the process group, as a launcher does, before ZeRO-3 partitions over it)
    if args.deepspeed:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")  # (accelerate leaves DeepSpeed's own on CPU processes)
    torch.manual_seed(3)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def layout_evidence(trainer) -> dict:
    params = list(trainer.model.parameters())
    return {"wrapper": type(trainer.model_wrapped).__name__,
            "distributed_type": trainer.accelerator.distributed_type.value,
            "num_processes": trainer.accelerator.num_processes,
            "dtensor_params": sum(type(p).__name__ == "DTensor" for p in params),
            "partitioned_params": sum(hasattr(p, "ds_id") and p.ds_tensor.numel() < p.ds_numel for p in params),
            "params": len(params)}


def main(layout, out):
    out = Path(out)
    for case, setting in CASES.items():
        for cls in (ORPOTrainer, FusedORPOTrainer):
            args = orpo_config(out / f"{case}-{cls.__name__}", gradient_accumulation_steps=setting["accumulation"],
                               **LAYOUTS[layout])
            trainer = cls(model=model_after(args), args=args, train_dataset=preference_data(rows=16),
                          processing_class=tokenizer(), peft_config=setting["adapter"])
            trainer.train()
            # (ZeRO-3 gathers the whole state on rank 0 alone)
            state = trainer.accelerator.get_state_dict(trainer.deepspeed or trainer.model_wrapped) or {}
            state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}  # (every rank)
            if trainer.accelerator.is_main_process:
                torch.save({"steps": [e for e in trainer.state.log_history if "loss" in e],
                            "layout": layout_evidence(trainer),
                            "parameters": {k: v.detach().float().cpu() for k, v in state.items()}},
                           out / f"{case}-{cls.__name__}.pt")
            trainer.accelerator.wait_for_everyone()
            del trainer


if __name__ == "__main__":
    main(*sys.argv[1:])
