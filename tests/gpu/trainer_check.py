"""A Hugging Face Trainer run, unchanged for ctrun, on a tiny BERT built
from a config (nothing downloaded): the Trainer sets up DDP over NCCL from
the launcher's environment."""
import tempfile

import torch
from transformers import (BertConfig, BertForSequenceClassification, Trainer,
                          TrainingArguments)

from agree import report


class Parity(torch.utils.data.Dataset):
    """Token sequences labelled by the parity of their sum."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 128, (256, 16), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i],
                "labels": int(self.ids[i].sum()) % 2}


config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=32, num_labels=2)
torch.manual_seed(0)
model = BertForSequenceClassification(config)
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, max_steps=30,
                             per_device_train_batch_size=8,
                             learning_rate=1e-3, report_to="none",
                             save_strategy="no", seed=0, disable_tqdm=True)
    result = Trainer(model=model, args=args, train_dataset=Parity()).train()
report("trainer", model, result.training_loss)
