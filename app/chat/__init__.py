"""Chat formatting: chat templates (sandboxed) and prompts cut to the context."""
