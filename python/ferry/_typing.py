"""The type aliases of the binding's annotations (the package ships
py.typed).  Tensors are typed loosely (Any): the binding takes numpy
arrays, torch tensors and ferry.Raw alike, and never imports torch just to
name its type.  Model and Store are named for type checkers only (they
import this module)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Union

if TYPE_CHECKING:
    from .model import Model
    from .sync import Store

# A file system path as the library takes it (errors.cpath encodes it).
PathArg = Union[str, bytes, os.PathLike]
# A tensor: numpy array, torch.Tensor (any device where the call allows
# it) or ferry.Raw.
Array = Any
# name -> tensor: a state_dict, an engine's weights, what load() returns.
Tensors = Mapping[str, Array]
# A model argument: a mapping (borrowed zero-copy), a checkpoint's path,
# or an open ferry.Model.
ModelArg = Union[Tensors, PathArg, "Model"]
# A patch: any bytes-like object.
Buffer = Union[bytes, bytearray, memoryview]
# A store argument: a URL or plain path, or an open ferry.Store.
StoreArg = Union[str, os.PathLike, "Store"]
# "auto", "np" or "pt" (see ferry.load).
Framework = str
