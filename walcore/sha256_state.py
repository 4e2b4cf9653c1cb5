"""SHA-256 whose state can be recorded and resumed: the hash of a file that grows is carried on from the bytes
it held, without reading them again (what an incremental backup of the newest xlog stores is only what was
appended). hashlib cannot export its state; OpenSSL's SHA256_CTX, through ctypes, can: it is the library hashlib
itself uses, at the same speed. Where it cannot be loaded, or does not give hashlib's digests, `available()` is
False and the caller stores whole files, as before.

A state is recorded in a form of its own, not OpenSSL's struct: the eight chaining words, the length hashed so
far and the bytes of its last partial 64-byte block (at most 63)."""

from __future__ import annotations

import ctypes
import hashlib
from functools import cache


class _Context(ctypes.Structure):  # OpenSSL's SHA256_CTX (openssl/sha.h)
    _fields_ = [("h", ctypes.c_uint32 * 8), ("Nl", ctypes.c_uint32), ("Nh", ctypes.c_uint32),
                ("data", ctypes.c_uint8 * 64), ("num", ctypes.c_uint32), ("md_len", ctypes.c_uint32)]


def _libcrypto() -> str | None:
    """The libcrypto hashlib loaded, as this process maps it (Linux: no ldconfig run, no second library); else the
    one ctypes finds."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and "/libcrypto.so" in fields[5]:
                    return fields[5].strip()
    except OSError:
        pass
    import ctypes.util  # with subprocess and shutil, and a run of ldconfig

    return ctypes.util.find_library("crypto")


@cache
def _library():
    """libcrypto with the SHA-256 calls checked against hashlib, or None."""
    name = _libcrypto()  # hashlib, imported above, has mapped its libcrypto where it has one
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        for call in (lib.SHA256_Init, lib.SHA256_Update, lib.SHA256_Final):
            call.restype = ctypes.c_int
        lib.SHA256_Update.argtypes = [ctypes.POINTER(_Context), ctypes.c_char_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    sample = bytes(range(256)) * 3
    try:
        first = ResumableSha256(lib)
        first.update(sample[:100])
        resumed = ResumableSha256.resume(first.state(), lib)
        resumed.update(sample[100:])
        if resumed.hexdigest() != hashlib.sha256(sample).hexdigest():
            return None
    except Exception:  # another struct layout than this one: not used
        return None
    return lib


def available() -> bool:
    return _library() is not None


class StateError(ValueError):
    """A recorded state that does not hold together."""


class ResumableSha256:
    """hashlib.sha256's update() and hexdigest(), plus state() and resume(state)."""

    def __init__(self, lib=None):
        self._lib = lib or _library()
        if self._lib is None:
            raise RuntimeError("no resumable SHA-256 here (libcrypto's SHA256_* not found)")
        self._ctx = _Context()
        self._lib.SHA256_Init(ctypes.byref(self._ctx))

    def update(self, data) -> None:
        # ctypes releases the GIL during the call: a thread of its own hashes beside the others
        if not isinstance(data, bytes):
            data = bytes(data)
        self._lib.SHA256_Update(ctypes.byref(self._ctx), data, len(data))

    def hexdigest(self) -> str:
        ctx = _Context.from_buffer_copy(self._ctx)  # the state goes on: Final works on a copy
        out = (ctypes.c_uint8 * 32)()
        self._lib.SHA256_Final(out, ctypes.byref(ctx))
        return bytes(out).hex()

    def state(self) -> dict:
        c = self._ctx
        length = ((c.Nh << 32) | c.Nl) >> 3
        return {"h": "".join(f"{w:08x}" for w in c.h), "length": length, "tail": bytes(c.data[:c.num]).hex()}

    @classmethod
    def resume(cls, state: dict, lib=None) -> ResumableSha256:
        try:
            words = bytes.fromhex(state["h"])
            length, tail = state["length"], bytes.fromhex(state["tail"])
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"a SHA-256 state that does not hold together: {e}") from None
        if len(words) != 32 or not isinstance(length, int) or length < 0 or len(tail) != length % 64:
            raise StateError("a SHA-256 state that does not hold together")
        out = cls(lib)
        c = out._ctx
        for i in range(8):
            c.h[i] = int.from_bytes(words[4 * i:4 * i + 4], "big")
        bits = length << 3
        c.Nl, c.Nh = bits & 0xFFFFFFFF, bits >> 32
        ctypes.memmove(c.data, tail, len(tail))
        c.num = len(tail)
        return out
