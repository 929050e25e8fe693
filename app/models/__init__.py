"""Model files: the library on disk, the hub, pairing targets with drafts, measured speedups."""
