"""The project's one error type, below everything else in `engines` so any module can raise it."""


class SpecDeskError(Exception):
    """An error the user can act on; its message is shown as-is (no traceback)."""
