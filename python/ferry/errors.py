"""FerryError: every non-zero status of libferry, as a Python exception."""
from . import _lib

# Stable codes (include/ferry.h, ferry_store.h, ferry_sync.h, ferry_sign.h), for callers
# that want to branch on one without a magic number.
OK = 0
ERR_NOMEM = 1
ERR_ARG = 2
ERR_IO = 3
ERR_UNSUPPORTED = 4
ERR_NOT_FOUND = 5
ERR_LIMIT = 6
ERR_PATCH_CORRUPT = 43
ERR_PATCH_CHECKSUM = 44
ERR_BASE_MISMATCH = 45
ERR_TARGET_MISMATCH = 46
ERR_SHAPE_MISMATCH = 47
ERR_STORE_NOT_FOUND = 62
ERR_STORE_CONFLICT = 63
ERR_STORE_TIMEOUT = 65
ERR_SIG_MISSING = 140
ERR_SIG_MALFORMED = 141
ERR_SIG_UNTRUSTED = 142
ERR_SIG_INVALID = 143
ERR_SIG_DIGEST = 144
ERR_SIG_KEY = 145
ERR_SHARD_PARTS = 160      # include/ferry_shard.h
ERR_SHARD_FOREIGN = 161
ERR_SHARD_WORLD = 162
ERR_SHARD_REGION = 163
ERR_SHARD_KIND = 164


class FerryError(Exception):
    """A libferry call failed.

    code     the stable FERRY_ERR_* number (45 = FERRY_ERR_BASE_MISMATCH ...)
    name     ferry_strerror(code), a short static description
    message  ferry_last_error(): the detailed message naming the file,
             object, tensor and field
    """

    def __init__(self, code, message="", name=None):
        self.code = int(code)
        self.name = name if name is not None else strerror(self.code)
        self.message = message
        text = "ferry error %d (%s)" % (self.code, self.name)
        if message:
            text += ": " + message
        super().__init__(text)


def strerror(code):
    s = _lib.lib.ferry_strerror(int(code))
    return s.decode("utf-8", "replace") if s else "unknown error"


def last_error():
    s = _lib.lib.ferry_last_error()
    return s.decode("utf-8", "replace") if s else ""


def check(status):
    """Raises FerryError for a non-zero status; returns None otherwise.

    ferry_last_error() is thread-local in C and ctypes releases the GIL
    around the call but runs it on this same thread, so the message read
    here is the one of the call that just failed."""
    if status != 0:
        raise FerryError(status, last_error())


def cstr(text, what):
    """text as the NUL-terminated UTF-8 the C API takes.  A NUL inside it
    would silently cut it there (two names "a\\0x", "a\\0y" would both
    become "a"), so it is refused with FERRY_ERR_ARG naming what it is."""
    b = text if isinstance(text, bytes) else str(text).encode("utf-8")
    if b"\0" in b:
        raise FerryError(ERR_ARG, "%s %r contains a NUL byte" % (what, text))
    return b


def cpath(path, what="path"):
    """A file system path (str, bytes, PathLike) for the C API; NUL refused."""
    import os
    return cstr(os.fsencode(path), what)
