"""Models: the embedded default (built once from its PyPI wheel), the build-once cache, format warm-ups, chat-template
set-up for tool calls, and naming the base model a run started from."""
