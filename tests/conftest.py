import os


# Tests never reach the Hugging Face Hub: models are built from configs, the tokenizer comes from the embedded default.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Where the kernel refuses user namespaces to a non-root user (Docker's default profile, recent Ubuntu), the sandbox
# refuses to run unless told to: the test suite's snippets are its own, so it opts in (the refusal itself is tested
# with an explicit environment).
os.environ.setdefault("TRL_EXT_SANDBOX_ALLOW_UNISOLATED", "1")
