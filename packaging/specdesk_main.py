"""Entry point of the frozen bundle: the same `specdesk` command as the installed script."""

import sys

from specdesk.app.main import main

if __name__ == "__main__":
    sys.exit(main())
