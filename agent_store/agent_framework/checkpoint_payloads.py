"""Reading a stored workflow checkpoint back: what its payload may rebuild, checked before anything is rebuilt.

A payload is what the framework's checkpoint encoding wrote: JSON, with each value JSON cannot hold pickled
(``{"__pickled__": base64, "__type__": ...}``). The framework's restricted decoding
(``decode_checkpoint_value(..., allowed_types=...)``) admits only allow-listed names, but it admits *every* class
of the agent_framework and openai.types packages, and pickle may *call* an admitted class: a crafted payload (a
row of an imported file, one written with SQL) could run ``FileCheckpointStorage(path)`` and create a directory of
its author's choice. So before a payload reaches the framework, each pickle in it is read opcode by opcode
(``pickletools`` parses, it builds nothing), and refused if it would:

- call anything but a value type: the framework's safe builtins (datetime, Decimal, collections, ...), an enum
  (a member lookup), a Python built-in exception, or a type the application allowed itself
  (``allowed_checkpoint_types``,
  ``register_checkpoint_type``). Every other class is rebuilt the way pickle rebuilds plain data (its
  ``__new__`` and its saved state), never by running its constructor;
- name a class the framework's allow-list refuses (its own check: a refused name is never imported);
- set attributes on something that is not an instance it just rebuilt (a class), or use pickle's extension
  registry or persistent ids, which the framework's encoder never writes.

Only then does the framework's own decoding run. Any refusal is a :class:`CheckpointRefusedError`.
"""

from __future__ import annotations

import base64
import binascii
import pickletools
from enum import Enum
from typing import Any

from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException

# The framework's own checkpoint encoding and its allow-list (not re-exported by the package).
from agent_framework._workflows._checkpoint_encoding import (
    _REGISTERED_CHECKPOINT_TYPE_KEYS,
    _RestrictedUnpickler,
    decode_checkpoint_value,
)

from agent_store.errors import CheckpointRefusedError

__all__ = ["decode_payload"]

_PICKLED, _TYPE = "__pickled__", "__type__"  # the framework's markers (_checkpoint_encoding._PICKLE_MARKER, ...)
# Calling these builds a value and does nothing else (the framework's safe set, less type(), which makes classes,
# and copyreg._reconstructor, which runs a named base class's __init__; protocol 5 never writes either).
_VALUE_CALLS = frozenset({
    "builtins:object", "builtins:complex", "builtins:range", "builtins:slice", "builtins:int", "builtins:float",
    "builtins:str", "builtins:bytes", "builtins:bytearray", "builtins:bool", "builtins:set", "builtins:frozenset",
    "builtins:list", "builtins:dict", "builtins:tuple", "datetime:datetime", "datetime:date", "datetime:time",
    "datetime:timedelta", "datetime:timezone", "uuid:UUID", "decimal:Decimal", "collections:OrderedDict",
    "collections:defaultdict", "collections:deque", "collections:Counter",
})  # fmt: skip
_GETATTR = frozenset({"builtins:getattr", "__builtin__:getattr"})  # the framework's restricted getattr
_STRINGS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
                      "SHORT_BINSTRING"})  # fmt: skip
_GETS, _PUTS = frozenset({"GET", "BINGET", "LONG_BINGET"}), frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_REFUSED = frozenset({"EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"})
_MARK, _ANY, _BUILT = ("mark",), ("any",), ("built",)  # stack items; also ("str", text) and ("global", key)


def decode_payload(payload: Any, allowed: frozenset[str]) -> WorkflowCheckpoint:
    """The checkpoint a stored payload holds, decoded by the framework under ``allowed`` once it passed the checks.

    Raises:
        CheckpointRefusedError: the payload would run a constructor, names a type outside the allow-list, or is
            not a checkpoint the framework can read; nothing it names was built.
    """
    trusted = allowed | _REGISTERED_CHECKPOINT_TYPE_KEYS  # as decode_checkpoint_value widens it
    for blob in _pickles(payload):
        _check_pickle(blob, trusted)
    try:
        return WorkflowCheckpoint.from_dict(decode_checkpoint_value(payload, allowed_types=allowed))
    except WorkflowCheckpointException as exc:  # a name outside the framework's allow-list, a type mismatch
        raise CheckpointRefusedError(f"a workflow checkpoint cannot be read back: {exc}") from exc
    except Exception as exc:  # the payload is not a checkpoint's dict (a crafted or damaged row)
        raise CheckpointRefusedError(f"a workflow checkpoint is malformed ({type(exc).__name__})") from exc


def _pickles(payload: Any) -> list[bytes]:
    """The pickles inside ``payload``, found as the framework's decoder finds them (iteratively: no recursion)."""
    found, pending = [], [payload]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            if _PICKLED in value and _TYPE in value:
                found.append(_unbase64(value[_PICKLED]))
            else:
                pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return found


def _unbase64(text: Any) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)  # exactly as the framework decodes it
    except (AttributeError, UnicodeError, binascii.Error) as exc:
        raise CheckpointRefusedError("a workflow checkpoint holds a pickled value that is not base64") from exc


def _check_pickle(data: bytes, trusted: frozenset[str]) -> None:
    """Follow the pickle machine's stack without building anything, refusing what the module docstring lists."""
    stack: list[tuple[Any, ...]] = []
    memo: dict[int, tuple[Any, ...]] = {}

    def pop(n: int = 1) -> list[tuple[Any, ...]]:
        if len(stack) < n:
            raise _refused("is malformed (stack underflow)")
        taken = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return taken

    def to_mark() -> list[tuple[Any, ...]]:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is _MARK:
                taken = stack[i + 1 :]
                del stack[i:]
                return taken
        raise _refused("is malformed (no mark)")

    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in _REFUSED:
                raise _refused(f"uses {name}, which the framework's encoder never writes")
            if name in _STRINGS:
                stack.append(("str", arg))
            elif name == "GLOBAL" or name == "INST":
                module, _, attr = str(arg).partition(" ")
                if name == "INST":
                    to_mark()
                    _callable(("global", f"{module}:{attr}"), trusted)
                stack.append(_BUILT if name == "INST" else ("global", f"{module}:{attr}"))
            elif name == "STACK_GLOBAL":
                where, what = pop(2)
                if where[0] != "str" or what[0] != "str":
                    raise _refused("names a class with computed strings")
                stack.append(("global", f"{where[1]}:{what[1]}"))
            elif name == "REDUCE":
                function, _ = pop(2)
                _callable(function, trusted)
                stack.append(_ANY if function[0] == "global" and function[1] in _GETATTR else _BUILT)
            elif name == "OBJ":
                items = to_mark()
                if not items:
                    raise _refused("is malformed (OBJ without a class)")
                _callable(items[0], trusted)
                stack.append(_BUILT)
            elif name in ("NEWOBJ", "NEWOBJ_EX"):
                cls = pop(3 if name == "NEWOBJ_EX" else 2)[0]
                if cls[0] != "global":  # e.g. getattr(int, "__class__"), which is type
                    raise _refused("makes an object of a class it computed")
                if _makes_classes(cls[1], trusted):
                    raise _refused("makes a class")
                stack.append(_BUILT)  # cls.__new__: no constructor runs
            elif name == "BUILD":
                target, _state = pop(2)
                if target is not _BUILT:
                    raise _refused("sets attributes on something it did not build (a class?)")
                stack.append(target)
            elif name == "DUP":
                stack.append(pop()[0])
                stack.append(stack[-1])
            elif name == "MEMOIZE" or name in _PUTS:
                memo[len(memo) if name == "MEMOIZE" else int(str(arg))] = stack[-1] if stack else _ANY
            elif name in _GETS:
                if int(str(arg)) not in memo:
                    raise _refused("is malformed (unknown memo entry)")
                stack.append(memo[int(str(arg))])
            else:  # everything else only moves data: pop what it takes, push opaque values
                before = [s.name for s in op.stack_before]
                if "mark" in before:
                    to_mark()
                    pop(before.index("mark"))
                else:
                    pop(len(before))
                stack.extend(_MARK if s.name == "mark" else _ANY for s in op.stack_after)
    except ValueError as exc:  # pickletools: truncated or unknown opcodes
        raise _refused("is not a pickle the framework wrote") from exc


def _callable(item: tuple[Any, ...], trusted: frozenset[str]) -> None:
    """Refuse calling ``item`` unless it is a value type, an enum, an exception or an application-allowed type."""
    if item[0] != "global":
        raise _refused("calls something that is not a named class")
    key: str = item[1]
    if key in _VALUE_CALLS or key in _GETATTR or key in trusted:
        return
    module, _, attr = key.partition(":")
    try:  # the framework's own allow-list decides whether the name may be loaded at all
        resolved = _RestrictedUnpickler(b"", trusted).find_class(module, attr)
    except Exception as exc:
        raise _refused(f"names {key[:200]!r}, which the allow-list refuses ({type(exc).__name__})") from exc
    # Enums are looked up, not built; Python's own exceptions only store their arguments. Another exception's
    # constructor is code (the framework's own logs its message, at the level the file asks for).
    if not isinstance(resolved, type) or not (
        issubclass(resolved, Enum) or (issubclass(resolved, BaseException) and resolved.__module__ == "builtins")
    ):
        raise _refused(f"would run the constructor of {key[:200]!r}; only value types are ever called")


def _makes_classes(key: str, trusted: frozenset[str]) -> bool:
    """Whether the named class is ``type`` or a metaclass (its ``__new__`` makes a class, running code)."""
    module, _, attr = key.partition(":")
    try:
        resolved = _RestrictedUnpickler(b"", trusted).find_class(module, attr)
    except Exception as exc:
        raise _refused(f"names {key[:200]!r}, which the allow-list refuses ({type(exc).__name__})") from exc
    return isinstance(resolved, type) and issubclass(resolved, type)


def _refused(why: str) -> CheckpointRefusedError:
    return CheckpointRefusedError(f"a workflow checkpoint was refused: a pickled value in it {why}")
