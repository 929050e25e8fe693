"""The engine process and the session over it: one chat or compare at a time, on a local engine."""
