"""The start-up rule for secrets (the Fed Ledger key, the HF token), shared by the validator and
the launcher.

A secret copied from a Windows `.env`, a web page or a terminal often carries a trailing
carriage return, surrounding spaces, a byte-order mark or a typographic quote. Surrounding
whitespace is stripped, since no key or token has any; what is left must be visible ASCII,
because both secrets travel in HTTP headers, where anything else either raises an error that
quotes the header (the key with it) or is refused by the server as a wrong key. A refusal names
the option, never the value or any part of it.
"""

from __future__ import annotations

import unicodedata

from validator.errors import MalformedSecret

VISIBLE_ASCII = range(0x21, 0x7F)


def normalise_secret(value: str | None, name: str) -> str | None:
    """The secret as it is to be used (surrounding whitespace stripped), None when unset.

    `name` is how the operator gives it, e.g. "--flock-api-key / FLOCK_API_KEY".
    Raises MalformedSecret for a value that is only whitespace or has any other character
    outside visible ASCII.
    """
    if value is None or value == "":  # click and the launcher's container env mean "unset"
        return None
    stripped = value.strip()
    if not stripped:
        raise MalformedSecret(f"{name} is set but holds only whitespace")
    flaw = _first_flaw(stripped)
    if flaw:
        raise MalformedSecret(
            f"{name} contains {flaw}; give the key or token exactly as issued "
            "(copy-paste from a Windows file or a web page adds such characters)"
        )
    return stripped


def _first_flaw(value: str) -> str | None:
    # Only the kind of character is named: its code point could be part of a mistyped secret.
    for char in value:
        if ord(char) in VISIBLE_ASCII:
            continue
        if char == " ":
            return "a space"
        if unicodedata.category(char) == "Cc":
            return "a control character (e.g. a carriage return or a tab)"
        return "a non-ASCII character (e.g. a typographic quote, an invisible mark)"
    return None
