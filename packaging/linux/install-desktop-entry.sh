#!/bin/sh
# Adds SpecDesk to the desktop's application menu for this user (no root needed):
# a .desktop file pointing at this folder's `specdesk`, and the icon.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
apps="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
icons="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/256x256/apps"
mkdir -p "$apps" "$icons"
cp "$here/specdesk.png" "$icons/specdesk.png"
sed "s|^Exec=specdesk|Exec=\"$here/specdesk\"|" "$here/specdesk.desktop" > "$apps/specdesk.desktop"
echo "SpecDesk added to the application menu ($apps/specdesk.desktop)"
