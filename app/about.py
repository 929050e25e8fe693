"""What this install is: SpecDesk's version and the llama.cpp build it runs on (backend, CPU
code, GPU offload), for `specdesk --version` and Help ▸ About."""

from __future__ import annotations

import platform

from specdesk.engines.types import SpecDeskError


def version_text() -> str:
    """SpecDesk's version and the llama.cpp build it runs on: backend, CPU code, GPU offload."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("specdesk")
    except PackageNotFoundError:  # a frozen bundle may carry no distribution metadata
        ours = "(version unknown)"
    try:
        from specdesk.engines.llama.devices import describe_build, llama_build

        llama = describe_build(llama_build())
    except SpecDeskError as e:
        llama = f"llama.cpp: {e}"
    return f"specdesk {ours}\n{llama}"


def about_text() -> str:
    """version_text plus the Python and platform, for the About box."""
    return f"{version_text()}\nPython {platform.python_version()} on {platform.system()} {platform.machine()}"
