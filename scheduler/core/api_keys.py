"""The API key format: how a key is made and the digest that stands for it.

Pure, so the store (which writes a tenant's digest) and the servicers (which look a
caller's key up by it) share one definition; why an unsalted SHA-256 is enough is in
:mod:`chronoshard.scheduler.api.auth`.
"""

from __future__ import annotations

import hashlib
import secrets

API_KEY_PREFIX = "cs_"
API_KEY_BYTES = 32


def new_api_key() -> str:
    """A fresh random API key: ``cs_`` + 32 random bytes, URL-safe base64."""
    return API_KEY_PREFIX + secrets.token_urlsafe(API_KEY_BYTES)


def hash_api_key(key: str) -> str:
    """The hex SHA-256 of ``key``: what ``tenants.api_key_hash`` stores."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()
