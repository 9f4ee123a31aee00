import os


# Tests never reach the Hugging Face Hub: models are built from configs, the tokenizer comes from the embedded default.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
