"""A user's content sealed with the user's own data key (issue 41; the keys: agent_store/keys.py).

A store opened with ``keys=`` seals what a user said and what a run keeps: each message's body (its text column
holds its blind index instead, below), each state value of a session's or of the user's own (``user:``) keys,
and the user's checkpoints, journal events, hosted responses and AG-UI snapshots. AES-256-GCM, a fresh
96-bit nonce each time, and associated data that binds the ciphertext to its row:

    "agent_store/k1" NUL <user id> NUL "m" NUL <message id>        a message (the store's id of it)
    "agent_store/k1" NUL <user id> NUL "s" NUL <state key>         a state value

(and likewise a checkpoint's workflow and id, a journal event's stream and number, a hosted item's or response's
id, an AG-UI snapshot's thread),

so content moved to another message, another key or another user's row fails to open (its tag does not
verify), and content of another user's is sealed under a key this user does not have. A fork copies a session's
rows to a new session of the same user: they open there too, which is what a fork is for.

What stays in clear, so the store can work and be queried: ids, roles, author and tool names, times, counts,
marks, ``app:`` state (an application's, not a user's), and the usage ledger. A token is
``k1.<key id>.<base64url(nonce + ciphertext)>``: the key id is what ``erase_user`` destroys.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import unicodedata
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import and_, cast, func
from sqlalchemy.dialects.postgresql import JSONB

from agent_store.db.erasures import Fence
from agent_store.errors import AgentStoreError, ConfigurationError, ContentSealedError, InvalidValueError

PREFIX = "k1."
SEALED = "$sealed"  # a sealed state value: {"$sealed": token}
_NONCE = 12


class UserCipher:
    """One user's keys, fetched for one call (a run, a transcript page): seals with the newest, opens with any."""

    binds_rows = True  # message_rows passes each message's id as its row

    def __init__(self, user_id: str, keys: dict[str, bytes]) -> None:
        self.user_id = user_id
        self._keys: dict[str, AESGCM] = {}
        self._index_keys: dict[str, bytes] = {}
        self.current: str | None = None
        for key_id, key in keys.items():
            self.add(key_id, key)

    def add(self, key_id: str, key: bytes) -> None:
        if not (isinstance(key_id, str) and key_id and "." not in key_id and isinstance(key, bytes) and len(key) == 32):
            raise ConfigurationError("the key provider gave a malformed key: a non-empty id without '.', 32 bytes")
        self._keys[key_id] = AESGCM(key)
        self._index_keys[key_id] = hmac.new(key, b"agent_store/blind-index/1", hashlib.sha256).digest()
        self.current = key_id if self.current is None or key_id > self.current else self.current

    def _aad(self, row: str) -> bytes:
        return "\0".join(("agent_store/k1", self.user_id, row)).encode()

    def encrypt(self, plaintext: str, row: str) -> str:
        if self.current is None:  # sealing.ready() makes one first: a write without it is the library's bug
            raise RuntimeError("no data key to seal with: await sealing.ready() before encoding a write")
        nonce = secrets.token_bytes(_NONCE)
        sealed = self._keys[self.current].encrypt(nonce, plaintext.encode(), self._aad(row))
        return f"{PREFIX}{self.current}.{base64.urlsafe_b64encode(nonce + sealed).decode()}"

    def decrypt(self, token: str, row: str) -> str:
        if not isinstance(token, str) or not token.startswith(PREFIX):  # not a seal of these keys: altered
            raise ContentSealedError("content not sealed with per-user keys (altered, or sealed by a store's "
                                     "message_cipher: open that Store with its cipher)")  # fmt: skip
        key_id, _, body = token[len(PREFIX):].partition(".")  # fmt: skip
        if key_id not in self._keys:
            raise ContentSealedError(f"content sealed with a key of the user's that is gone (erased), or another "
                                     f"user's content: it cannot be read as user {self.user_id!r}'s")  # fmt: skip
        try:
            raw = base64.urlsafe_b64decode(body)
            return self._keys[key_id].decrypt(raw[:_NONCE], raw[_NONCE:], self._aad(row)).decode()
        except (InvalidTag, binascii.Error, ValueError) as exc:
            raise ContentSealedError("sealed content that does not belong to this row (moved, or altered)") from exc

    # The blind index (exact terms): a sealed message's text column holds one token a term, the first 6 bytes of
    # HMAC-SHA256 under the user's index key (derived from the data key), in hex; search looks the tokens up.
    def index_text(self, text: str) -> str:
        """What a sealed message's ``text`` column holds: its terms' tokens in order, then its single characters'
        (at most INDEXED_TERMS of each: 13 bytes a token, so at most about 130 KB a message)."""
        ordered, singles = blind_terms(text)
        singles = sorted({self._token(c) for c in singles})  # by token: an order by character would tell them
        return " ".join([*map(self._token, ordered[:INDEXED_TERMS]), *singles[:INDEXED_TERMS]])

    def tokens(self, term: str) -> list[str]:
        """A query term's tokens under each of the user's keys: the same words, in order, as the index holds them."""
        ordered, _ = blind_terms(term)
        return [" ".join(self._token(t, key_id) for t in ordered) for key_id in sorted(self._keys)] if ordered else []

    def _token(self, term: str, key_id: str | None = None) -> str:
        index_key = self._index_keys.get(key_id or self.current or "")
        if index_key is None:
            raise RuntimeError("no data key to index with: await sealing.ready() before encoding a write")
        return hmac.new(index_key, term.encode(), hashlib.sha256).hexdigest()[:12]


INDEXED_TERMS = 5_000  # a message's first terms that search finds (a plain message's: its first 100,000 chars)
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_PIECES = re.compile(f"[{_CJK}]+|[^\\W_{_CJK}]+")


def blind_terms(text: str) -> tuple[list[str], list[str]]:
    """A text's terms in order (words, case-folded; Chinese, Japanese and Korean runs as overlapping pairs of
    characters, which have no spaces between words) and its single such characters (so one finds them too)."""
    ordered: list[str] = []
    singles: list[str] = []
    for piece in _PIECES.findall(unicodedata.normalize("NFKC", text).casefold()):
        if re.match(f"[{_CJK}]", piece):
            ordered += [piece[i : i + 2] for i in range(len(piece) - 1)] or [piece]
            singles += piece
        else:
            ordered.append(piece)
    return ordered, singles


def message_row(message_id: str) -> str:
    return "m\0" + message_id


def state_row(key: str) -> str:
    return "s\0" + key


def seals_state(cipher: Any, key: str) -> bool:
    """Whether a state key's value is sealed: a user's keys seal all but an application's (``app:``) ones."""
    return isinstance(cipher, UserCipher) and not key.startswith("app:")


def seal_state(cipher: Any, key: str, text: str) -> str:
    """The stored JSON of a state value whose canonical JSON is ``text``."""
    return seal_json(cipher, state_row(key), text)


def open_state(cipher: Any, key: str, value: Any) -> tuple[Any, str | None]:
    """A stored state value, opened if sealed: (the value, its canonical JSON), or (value, None) if not sealed."""
    return open_json(cipher, state_row(key), value) if seals_state(cipher, key) else (value, None)


def seal_json(cipher: UserCipher, row: str, text: str) -> str:
    """``{"$sealed": token}``: the stored JSON of a JSON payload ``text`` of ``row`` (a state value, a checkpoint,
    a journal event, a hosted item, an AG-UI snapshot)."""
    return json.dumps({SEALED: cipher.encrypt(text, row)})


def open_json(cipher: UserCipher | None, row: str, value: Any) -> tuple[Any, str | None]:
    """A stored JSON payload, opened if sealed: (the value, its JSON text); (value, None) if it is not sealed."""
    if not (isinstance(value, dict) and len(value) == 1 and isinstance(value.get(SEALED), str)
            and value[SEALED].startswith(PREFIX)):  # fmt: skip  # (what is_sealed finds in SQL)
        if isinstance(cipher, UserCipher):  # a store with keys seals all of it: clear content was put there
            raise in_clear(row.partition("\0")[0])
        return value, None
    if cipher is None:
        raise InvalidValueError("this content is sealed with per-user keys: open the Store with its keys")
    text = cipher.decrypt(value[SEALED], row)
    return json.loads(text), text


def in_clear(what: str) -> ContentSealedError:
    """The refusal of content in clear where a store with keys keeps it sealed: written there outside agent_store
    (content substituted for a user's), or before the keys were turned on (``agent-store keys seal`` seals it)."""
    return ContentSealedError(f"content in clear ({_KINDS.get(what, what)}) in a store with per-user keys: put there "
                              "outside agent_store, or stored before keys were turned on (`agent-store keys seal`)")


_KINDS = {"m": "a message", "s": "a state value", "c": "a checkpoint", "e": "a journal event", "i": "a hosted item",
          "r": "a hosted response", "u": "an AG-UI snapshot"}  # fmt: skip


def sealed_marker(column: Any, key: str, pg: bool) -> Any:
    """SQL: the token a sealed JSON value holds under ``key`` (``SEALED``; a message body's ``$encrypted``), NULL
    for a value in clear, on either backend."""
    return func.jsonb_extract_path_text(cast(column, JSONB), key) if pg else func.json_extract(column, f'$."{key}"')


def is_sealed(column: Any, key: str, pg: bool) -> Any:
    """SQL, never NULL: whether a stored JSON value is sealed as ``seal_json`` (or a message body's seal) writes
    it: an object of that one key, whose token is a seal's (``k1.``). What ``open_json`` opens; anything else,
    a value that only looks like one included, is in clear (``keys seal`` seals it)."""
    marker = sealed_marker(column, key, pg)
    whole = cast(column, JSONB) == func.jsonb_build_object(key, marker) if pg else (
        func.json(column) == func.json_object(key, marker))  # fmt: skip
    return func.coalesce(and_(marker.like(PREFIX + "%"), whole), False)


async def cipher_for(db: Any, user_id: str | None) -> Any:
    """The cipher a call for ``user_id`` uses: the user's keys (``Store(keys=...)``, fetched now: one erased
    since is never used), the store's ``message_cipher``, or None."""
    provider = db.settings.keys
    if provider is None:
        return db.settings.message_cipher
    owner = user_id or ""
    return UserCipher(owner, await _asking(provider.keys(owner)))


async def for_user(db: Any, user_id: str | None, *, writing: bool, fence: Fence | None = None) -> UserCipher | None:
    """The user's keys for sealing (``writing``: with a key to seal with) or opening, or None (no ``keys=``)."""
    if db.settings.keys is None:
        return None
    cipher = await (ready(db, user_id, None, fence=fence) if writing else cipher_for(db, user_id))
    return cipher if isinstance(cipher, UserCipher) else None


async def ready(db: Any, user_id: str | None, cipher: Any, *, fence: Fence | None = None) -> Any:
    """``cipher`` (fetched if not yet) with a key to seal with: a user's first write makes the user's first key.

    ``fence`` is awaited before a key is made: a write that its erasure fence will refuse (a run, a checkpoint,
    a journal batch that read before the user was erased) must not leave a new, empty key behind. The write's
    own check, in its transaction, stays the guarantee; this only keeps the key file clean of it."""
    if cipher is None and db.settings.keys is not None:
        cipher = await cipher_for(db, user_id)
    if isinstance(cipher, UserCipher) and cipher.current is None:
        if fence is not None:
            await fence()
        cipher.add(*await _asking(db.settings.keys.new_key(cipher.user_id)))
    return cipher


async def destroy(db: Any, user_id: str) -> int:
    """Destroy every key of ``user_id`` (``erase_user``): what they sealed can never be opened again."""
    return int(await _asking(db.settings.keys.destroy(user_id)))


async def _asking(call: Any) -> Any:
    try:
        return await call
    except AgentStoreError:
        raise
    except Exception as exc:  # a plugged-in provider's own failure: typed, and said
        raise ConfigurationError(f"the key provider failed: {type(exc).__name__}: {exc}") from exc
