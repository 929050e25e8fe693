"""`specdesk serve` (an OpenAI-compatible API over a session) and the client for served engines."""
