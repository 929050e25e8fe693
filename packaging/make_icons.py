"""Draw SpecDesk's icon and write it in each platform's format into packaging/icons/.

The icon is drawn with Qt (offscreen) so no image tool is needed: a rounded tile with a
row of tokens, the accepted draft tokens in green and the rejected tail in grey, which is
what the app's chat view highlights. Run it again only to change the design; the output
files are committed.

    python packaging/make_icons.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ICONS = Path(__file__).resolve().parent / "icons"
SIZES = (16, 32, 48, 64, 128, 256, 512)


def draw(size: int):
    from PySide6.QtCore import QRectF, Qt
    from PySide6.QtGui import QColor, QImage, QPainter

    image = QImage(size, size, QImage.Format_ARGB32)
    image.fill(Qt.transparent)
    p = QPainter(image)
    p.setRenderHint(QPainter.Antialiasing)
    s = size / 256.0
    p.setPen(Qt.NoPen)
    p.setBrush(QColor("#1f2a44"))
    p.drawRoundedRect(QRectF(8 * s, 8 * s, 240 * s, 240 * s), 44 * s, 44 * s)
    # Three rows of "tokens": accepted (green), the target's own token (blue), rejected (grey).
    rows = [
        ("#3fb950", "#3fb950", "#3fb950", "#58a6ff"),
        ("#3fb950", "#3fb950", "#58a6ff", "#6e7681"),
        ("#3fb950", "#3fb950", "#3fb950", "#3fb950"),
    ]
    for r, colours in enumerate(rows):
        for c, colour in enumerate(colours):
            p.setBrush(QColor(colour))
            p.drawRoundedRect(QRectF((40 + c * 46) * s, (52 + r * 56) * s, 38 * s, 38 * s), 8 * s, 8 * s)
    p.end()
    return image


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 - QImage needs one
    ICONS.mkdir(parents=True, exist_ok=True)
    images = {size: draw(size) for size in SIZES}
    written = []
    for name, image in (("specdesk.png", images[256]), ("specdesk-512.png", images[512])):
        image.save(str(ICONS / name), "PNG")
        written.append(name)
    # Qt's ico and icns writers take the largest image they support from one QImage.
    if images[256].save(str(ICONS / "specdesk.ico"), "ICO"):
        written.append("specdesk.ico")
    if images[512].save(str(ICONS / "specdesk.icns"), "ICNS"):
        written.append("specdesk.icns")
    print("wrote " + ", ".join(str(ICONS / n) for n in written))
    return 0 if len(written) == 4 else 1


if __name__ == "__main__":
    sys.exit(main())
