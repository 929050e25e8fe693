"""Entry point of the frozen bundle: the same `specdesk` command as the installed script."""

import multiprocessing
import sys

from specdesk.ui.cli import main

if __name__ == "__main__":
    # The engine host (app/runtime/engine_client.py) is a 'spawn' child: the frozen executable starts
    # again as that child, and this hands it over to multiprocessing instead of running main().
    multiprocessing.freeze_support()
    sys.exit(main())
