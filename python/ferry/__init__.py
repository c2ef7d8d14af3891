"""ferry: lossless sparse BF16 policy patches, from Python.

A ctypes binding over libferry.so (found through $FERRY_LIB, then the
source tree's build/libferry.so, then the system library path).  numpy
arrays and CPU torch tensors are passed to the library zero-copy; see
README.md ("Python") and the docstrings of each function.

    import ferry
    w = ferry.load("step-000.safetensors")          # name -> array
    patch = ferry.diff("step-000.safetensors", model.state_dict(), cast_bf16=True)
    ferry.apply_inplace(engine_weights, patch)       # verified; on error untouched

    pub = ferry.Publisher("s3://bucket/p", "run-7")  # trainer (sync layer)
    pub.publish(model.state_dict())
    sub = ferry.Subscriber("s3://bucket/p", "run-7") # rollout worker
    sub.sync_into(engine_weights)

Modules: _lib (loading, prototypes), errors (FerryError, its subclass per
error area, the ERR_* codes), model (Model, load/save, dtype mapping),
patch (diff/apply), sync (Store, Publisher, Subscriber; present when
libferry has the sync layer), layout (engine
layout of a tensor-parallel model), fp8 (dequantize FP8 block-quantized
weights, include/ferry_quant.h), shard (sharded publish from
torch.distributed trainer ranks, sliced pull applied to an engine's TP
parameters; present when libferry has ferry_shard.h), dock (Dock: engines
put trajectory batches, the trainer takes them under a staleness policy).
"""
from . import _lib
from .errors import (FerryError, FormatError, PatchError, StoreError, SyncError, DockError,
                     LocoError, SignatureError, ShardError, strerror, last_error)
from . import errors
from .model import (Model, Raw, DTYPE_NAMES, load, save, model_hash, f32_to_bf16)
from .patch import diff, apply, apply_file, apply_inplace, inspect
from . import layout
from . import fp8

__version__ = _lib.lib.ferry_version().decode()
library_path = _lib.path

__all__ = ["FerryError", "FormatError", "PatchError", "StoreError", "SyncError", "DockError",
           "LocoError", "SignatureError", "ShardError", "errors", "strerror", "last_error",
           "Model", "Raw", "DTYPE_NAMES",
           "load", "save", "model_hash", "f32_to_bf16", "diff", "apply",
           "apply_file", "apply_inplace", "inspect", "library_path", "fp8"]

if _lib.has("ferry_publisher_open") or _lib.has("ferry_publisher_create"):
    from .sync import Publisher, Subscriber, Store  # noqa: F401
    __all__ += ["Publisher", "Subscriber", "Store"]
if _lib.has("ferry_mirror_once"):
    from .sync import mirror_once  # noqa: F401
    __all__ += ["mirror_once"]
if _lib.has("ferry_keygen"):
    from .sign import Keys, keygen  # noqa: F401
    __all__ += ["Keys", "keygen"]
if _lib.has("ferry_dock_open") and "Store" in __all__:
    from .dock import Dock, Batch  # noqa: F401
    __all__ += ["Dock", "Batch"]
if _lib.has("ferry_shard_pull"):
    from . import shard  # noqa: F401  (ShardPublisher, ShardSubscriber)
