"""API keys of servers, kept in the OS keyring (`keyring`), never in settings.json.

Where keyring finds no backend (a headless Linux without a Secret Service, say), a key is
kept in memory for this session only, and `store_key` says so in one line.
"""

from __future__ import annotations

from typing import Optional

SERVICE = "specdesk"  # the keyring service name; the username is the server's base URL

_session: dict[str, str] = {}  # url -> key, when the keyring cannot keep it


def _keyring():
    """The keyring module when it has a usable backend, else None."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:  # noqa: BLE001 - a broken keyring configuration is the same as none
        return None
    return None if isinstance(backend, fail.Keyring) else keyring


def keyring_available() -> bool:
    return _keyring() is not None


def store_key(url: str, key: Optional[str]) -> str:
    """Keep (or, with no key, forget) the key for `url`; returns one line saying where it went."""
    backend = _keyring()
    if not key:
        _session.pop(url, None)
        if backend is not None:
            try:
                backend.delete_password(SERVICE, url)
            except Exception:  # noqa: BLE001 - nothing stored is fine
                pass
        return "no API key"
    if backend is not None:
        try:
            backend.set_password(SERVICE, url, key)
            _session.pop(url, None)
            return "API key stored in the system keyring"
        except Exception as e:  # noqa: BLE001 - a locked or refusing keyring: keep it for the session
            _session[url] = key
            return f"the system keyring refused the key ({type(e).__name__}): kept for this session only"
    _session[url] = key
    return "no system keyring on this machine (keyring found no backend): the API key is kept for this session only"


def load_key(url: str) -> Optional[str]:
    if url in _session:
        return _session[url]
    backend = _keyring()
    if backend is None:
        return None
    try:
        return backend.get_password(SERVICE, url)
    except Exception:  # noqa: BLE001 - an unreadable keyring reads as no key
        return None
