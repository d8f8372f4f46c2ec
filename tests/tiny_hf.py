"""Tiny random Hugging Face models, a word-level tokenizer and a preference dataset, all made here (nothing
downloaded), and the ORPOConfig the trainer tests share. Needs the trl extra."""

import datasets
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from trl.experimental.orpo import ORPOConfig

WORDS = [f"w{i}" for i in range(120)]


def tokenizer():
    """A word-level tokenizer made here (nothing downloaded)."""
    vocab = {word: i for i, word in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>")


def tiny_llama(seed=0, vocab=len(WORDS) + 4):
    return tiny_model("llama", seed, vocab)


# Tiny random models of the families whose heads change their logits, each with the option that does it set
# so that it changes the loss (a random model's logits are small: Gemma-2's default cap of 30 would hardly bite).
HEADS = {
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig, {}),
    "gemma2": (transformers.Gemma2ForCausalLM, transformers.Gemma2Config, dict(final_logit_softcapping=0.15,
                                                                               head_dim=8)),
    "granite": (transformers.GraniteForCausalLM, transformers.GraniteConfig, dict(logits_scaling=8.0)),
    "cohere": (transformers.CohereForCausalLM, transformers.CohereConfig, dict(logit_scale=0.0625)),
    "falcon_h1": (transformers.FalconH1ForCausalLM, transformers.FalconH1Config, dict(lm_head_multiplier=0.5)),
}


def tiny_model(kind, seed=0, vocab=len(WORDS) + 4):
    model_cls, config_cls, options = HEADS[kind]
    torch.manual_seed(seed)
    config = config_cls(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, **options)
    return model_cls(config).float()


def preference_data(rows=8, seed=1):
    gen = torch.Generator().manual_seed(seed)

    def text(low, high):
        return " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (int(torch.randint(low, high, (1,), generator=gen)),),
                                                        generator=gen))
    return datasets.Dataset.from_dict({"prompt": [text(2, 6) for _ in range(rows)],
                                       "chosen": [text(2, 9) for _ in range(rows)],
                                       "rejected": [text(2, 9) for _ in range(rows)]})


def orpo_config(output_dir, steps=3, **layout) -> ORPOConfig:
    """Three logged steps of 2 pairs per process on the CPU; ``layout``: fsdp, deepspeed, accumulation, ..."""
    return ORPOConfig(output_dir=str(output_dir), per_device_train_batch_size=2, max_steps=steps, learning_rate=1e-3,
                      logging_steps=1, report_to=[], beta=0.25, max_length=24, use_cpu=True, bf16=False,
                      save_strategy="no", seed=0, dataloader_num_workers=0, **layout)


def trainer(cls, model, tmp_path, steps=3, **kwargs):
    return cls(model=model, args=orpo_config(tmp_path, steps), train_dataset=preference_data(),
               processing_class=tokenizer(), **kwargs)
