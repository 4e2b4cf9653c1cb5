"""A small, independent reader of limestone entries (limestone-files.md), for tests to compute their
expectations without walcore."""

from __future__ import annotations

import struct


def walk(data: bytes):
    """(offset, type, fields) per entry; a final (offset, 'short'|'unknown', type) if the bytes stop mid-entry."""
    i = 0
    while i < len(data):
        t = data[i]
        try:
            if t in (1, 10):
                klen, vlen, sid = struct.unpack_from("<IIQ", data, i + 1)
                j = i + 17
                key = data[j:j + klen]
                j += klen
                wv = struct.unpack_from("<QQ", data, j)
                j += 16
                value = data[j:j + vlen]
                j += vlen
                if t == 10:
                    (n,) = struct.unpack_from("<I", data, j)
                    j += 4 + 8 * n
                if j > len(data):
                    raise struct.error("short")
                yield i, t, {"storage": sid, "key": key, "value": value, "wv": wv}
            elif t == 5:
                klen, sid = struct.unpack_from("<IQ", data, i + 1)
                j = i + 13 + klen
                wv = struct.unpack_from("<QQ", data, j)
                j += 16
                yield i, t, {"storage": sid, "key": data[i + 13:i + 13 + klen], "wv": wv}
            elif t in (2, 4, 6):
                (epoch,) = struct.unpack_from("<Q", data, i + 1)
                j = i + 9
                yield i, t, {"epoch": epoch}
            elif t == 3:
                (epoch,) = struct.unpack_from("<Q", data, i + 1)
                struct.unpack_from("<B", data, i + 9)
                j = i + 10
                yield i, t, {"epoch": epoch}
            elif t in (7, 8, 9):
                sid, major, minor = struct.unpack_from("<QQQ", data, i + 1)
                j = i + 25
                yield i, t, {"storage": sid, "wv": (major, minor)}
            else:
                yield i, "unknown", t
                return
        except struct.error:
            yield i, "short", t
            return
        i = j
