"""FerryError: every non-zero status of libferry, as a Python exception of
the class of the code's area (StoreError for 60..79, SyncError for 80..99 ...;
FerryError is the base of them all, so `except FerryError` still catches
every one).

The codes are those of include/ferry_errors.h, the one list of them in C:
tests/python/test_errors.py fails if a code there is missing or different
here, or if the library's ferry_strerror() disagrees with the list."""
from . import _lib

# Stable codes, for callers that want to branch on one without a magic
# number: FERRY_ERR_X in C is ERR_X here.
OK = 0

# core (include/ferry.h)
ERR_NOMEM = 1
ERR_ARG = 2
ERR_IO = 3
ERR_UNSUPPORTED = 4
ERR_NOT_FOUND = 5
ERR_LIMIT = 6
ERR_INTERNAL = 7

# safetensors (include/ferry.h): FormatError
ERR_ST_TRUNCATED = 10
ERR_ST_HEADER_SIZE = 11
ERR_ST_JSON = 12
ERR_ST_DTYPE = 13
ERR_ST_SHAPE = 14
ERR_ST_OFFSETS = 15
ERR_ST_SIZE = 16
ERR_ST_TRAILING = 17
ERR_ST_METADATA = 18
ERR_ST_DUPLICATE = 19
ERR_ST_INDEX = 20

# patch codec (include/ferry.h): PatchError
ERR_PATCH_MAGIC = 40
ERR_PATCH_VERSION = 41
ERR_PATCH_TRUNCATED = 42
ERR_PATCH_CORRUPT = 43
ERR_PATCH_CHECKSUM = 44
ERR_BASE_MISMATCH = 45
ERR_TARGET_MISMATCH = 46
ERR_SHAPE_MISMATCH = 47

# store (include/ferry_store.h): StoreError
ERR_STORE_URL = 60
ERR_STORE_KEY = 61
ERR_STORE_NOT_FOUND = 62
ERR_STORE_CONFLICT = 63
ERR_STORE_AUTH = 64
ERR_STORE_TIMEOUT = 65
ERR_STORE_HTTP = 66
ERR_STORE_NET = 67
ERR_STORE_READONLY = 68
ERR_STORE_CORRUPT = 69
ERR_STORE_RANGE = 70
ERR_STORE_CANCELED = 71

# sync (include/ferry_sync.h): SyncError
ERR_SYNC_CONFLICT = 80
ERR_SYNC_MANIFEST = 81
ERR_SYNC_CORRUPT = 82
ERR_SYNC_NOT_YET = 83
ERR_SYNC_GONE = 84
ERR_SYNC_NO_PATH = 85
ERR_SYNC_SHAPE = 86
ERR_SYNC_BACKWARDS = 87
ERR_SYNC_TIMEOUT = 88
ERR_SYNC_RUN = 89
ERR_SYNC_FOREIGN = 90

# dock (include/ferry_dock.h): DockError
ERR_DOCK_MAGIC = 100
ERR_DOCK_FORMAT = 101
ERR_DOCK_TRUNCATED = 102
ERR_DOCK_LENGTH = 103
ERR_DOCK_HEADER = 104
ERR_DOCK_CHECKSUM = 105
ERR_DOCK_RUN = 106
ERR_DOCK_KEY = 107
ERR_DOCK_MISPLACED = 108
ERR_DOCK_FUTURE = 109
ERR_DOCK_CURSOR = 110
ERR_DOCK_REGRESSED = 111
ERR_DOCK_CONTENDED = 112
ERR_DOCK_SIGNATURE = 113
ERR_DOCK_REPLAY = 114
ERR_DOCK_ROLLBACK = 115

# loco (include/ferry_loco.h): LocoError
ERR_LOCO_MAGIC = 120
ERR_LOCO_VERSION = 121
ERR_LOCO_TRUNCATED = 122
ERR_LOCO_CORRUPT = 123
ERR_LOCO_CHECKSUM = 124
ERR_LOCO_INDEX = 125
ERR_LOCO_COUNT = 126
ERR_LOCO_VALUE = 127
ERR_LOCO_SIZE = 128
ERR_LOCO_ROUND = 129
ERR_LOCO_TRAILING = 130
ERR_LOCO_MPI = 131
ERR_LOCO_DIVERGED = 132
ERR_LOCO_PEER = 133
ERR_LOCO_MODE = 134

# signatures (include/ferry_sign.h): SignatureError
ERR_SIG_MISSING = 140
ERR_SIG_MALFORMED = 141
ERR_SIG_UNTRUSTED = 142
ERR_SIG_INVALID = 143
ERR_SIG_DIGEST = 144
ERR_SIG_KEY = 145

# sharding (include/ferry_shard.h): ShardError
ERR_SHARD_PARTS = 160
ERR_SHARD_FOREIGN = 161
ERR_SHARD_WORLD = 162
ERR_SHARD_REGION = 163
ERR_SHARD_KIND = 164
ERR_SHARD_INDEX = 165

# Every code by its name here ("ERR_STORE_NOT_FOUND": 62).
CODES = {k: v for k, v in globals().items() if k.startswith("ERR_")}


class FerryError(Exception):
    """A libferry call failed.

    code     the stable FERRY_ERR_* number (ERR_BASE_MISMATCH = 45 ...)
    name     ferry_strerror(code), a short static description
    message  ferry_last_error(): the detailed message naming the file,
             object, tensor and field

    FerryError(code, ...) makes an instance of the code's area class
    (error_class(code)): FerryError(ERR_STORE_NOT_FOUND) is a StoreError.
    Core codes (ERR_NOMEM .. ERR_INTERNAL) and unknown numbers stay FerryError.
    """

    def __new__(cls, code=0, message="", name=None):
        if cls is FerryError:
            cls = error_class(code)
        return super().__new__(cls)

    def __init__(self, code, message="", name=None):
        self.code = int(code)
        self.name = name if name is not None else strerror(self.code)
        self.message = message
        text = "ferry error %d (%s)" % (self.code, self.name)
        if message:
            text += ": " + message
        super().__init__(text)

    def __reduce__(self):
        # self.args holds the formatted text, not the constructor's
        # arguments: pickle (multiprocessing) rebuilds from these instead.
        return (type(self), (self.code, self.message, self.name))


class FormatError(FerryError):
    """safetensors: a file or sharded index that is malformed (ERR_ST_*, 10..39)."""


class PatchError(FerryError):
    """A patch that is malformed, or for another base / structure (40..59)."""


class StoreError(FerryError):
    """An object store call failed (ERR_STORE_*, 60..79)."""


class SyncError(FerryError):
    """Publisher / subscriber / mirror: HEAD, manifests, versions (ERR_SYNC_*, 80..99)."""


class DockError(FerryError):
    """Trajectory batches and their cursor (ERR_DOCK_*, 100..119)."""


class LocoError(FerryError):
    """Low-communication training payloads and rounds (ERR_LOCO_*, 120..139)."""


class SignatureError(FerryError):
    """Signatures and keys (ERR_SIG_*, 140..159)."""


class ShardError(FerryError):
    """Sharded publish and sliced pull (ERR_SHARD_*, 160..179)."""


# The range map of include/ferry_errors.h: [first, last] -> class.
_AREAS = ((10, 39, FormatError), (40, 59, PatchError), (60, 79, StoreError),
          (80, 99, SyncError), (100, 119, DockError), (120, 139, LocoError),
          (140, 159, SignatureError), (160, 179, ShardError))


def error_class(code):
    """The exception class of a status code's area (FerryError if none)."""
    try:
        c = int(code)
    except (TypeError, ValueError):
        return FerryError
    for first, last, cls in _AREAS:
        if first <= c <= last:
            return cls
    return FerryError


def strerror(code):
    s = _lib.lib.ferry_strerror(int(code))
    return s.decode("utf-8", "replace") if s else "unknown error"


def last_error():
    s = _lib.lib.ferry_last_error()
    return s.decode("utf-8", "replace") if s else ""


def check(status):
    """Raises FerryError (the subclass of the code's area) for a non-zero
    status; returns None otherwise.

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
