"""The desktop app: PySide6 widgets and pyqtgraph charts over one engine worker thread."""

import os

os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")  # pyqtgraph must bind the same Qt as the widgets
