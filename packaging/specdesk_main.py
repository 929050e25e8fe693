"""Entry point of the frozen bundle: the same `specdesk` command as the installed script."""

import multiprocessing
import sys

from specdesk.engines.llama import cpu_probe
from specdesk.ui.cli import main

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == cpu_probe.FLAG:  # cpu_variant.probe's child
        cpu_probe.run(sys.argv[2])
        sys.exit(0)
    # The engine host (app/runtime/engine_client.py) is a 'spawn' child: the frozen executable starts
    # again as that child, and this hands it over to multiprocessing instead of running main().
    multiprocessing.freeze_support()
    sys.exit(main())
