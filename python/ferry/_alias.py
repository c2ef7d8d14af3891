"""Tensors that share memory, for the calls that write into the caller's
tensors (apply_inplace, Subscriber.sync_into).

A tied-embedding LLM's state_dict holds one storage under two names
(embed_tokens.weight and lm_head.weight).  Handed to the library as two
tensors, the second name would be decoded against bytes the first one
already changed, and every valid patch would be rejected.  So names that
are the very same view (same memory, dtype and shape) form a group: each
name is patched in a private host copy, the group must come out
bit-identical (else the version cannot live in one storage: refused), and
only then is the storage written, once.  Views that overlap without being
the same view cannot be patched consistently at all and are refused.
"""
import numpy as np

from .errors import ERR_ARG, FerryError
from .model import Raw, _torch, _view_bytes


def _span(obj):
    """(memory space, first byte, end byte, view key) of a tensor/array."""
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        n = obj.numel() * obj.element_size()
        start = obj.data_ptr()
        if n and not obj.is_contiguous():
            # Strided views span more than their element bytes.
            lo = sum(min(0, (s - 1) * st) for s, st in zip(obj.shape, obj.stride()))
            hi = sum(max(0, (s - 1) * st) for s, st in zip(obj.shape, obj.stride()))
            start, n = start + lo * obj.element_size(), (hi - lo + 1) * obj.element_size()
        key = (str(obj.dtype), tuple(obj.shape), tuple(obj.stride()))
        return str(obj.device), start, start + n, key
    a = obj.data if isinstance(obj, Raw) else obj
    if isinstance(a, np.ndarray):
        lo, hi = np.byte_bounds(a)
        dt = obj.dtype if isinstance(obj, Raw) else str(a.dtype)
        return "cpu", lo, hi, (dt, tuple(a.shape), a.strides)
    return None


def groups(tensors):
    """[[name, ...], ...]: the names of tensors that are one view of one
    memory, two or more to a group, in the mapping's order.  Raises
    FerryError(ERR_ARG) for two tensors whose memory overlaps without being
    the same view."""
    spans = []
    for name, obj in tensors.items():
        s = _span(obj)
        if s is not None and s[2] > s[1]:
            spans.append((s[0], s[1], s[2], s[3], name))
    spans.sort(key=lambda s: (s[0], s[1], s[2]))
    out, cur = [], None
    for s in spans:
        if cur is not None and s[0] == cur[0] and s[1] < cur[2]:
            if (s[1], s[2], s[3]) != (cur[1], cur[2], cur[3]):
                raise FerryError(ERR_ARG, "tensors %r and %r overlap in memory without being "
                                 "the same view (dtype, shape, strides); only identical "
                                 "views (tied parameters) can share memory when patched "
                                 "in place" % (cur[4], s[4]))
            out[-1].append(s[4])
            continue
        cur = s
        out.append([s[4]])
    order = {n: i for i, n in enumerate(tensors)}
    return sorted((sorted(g, key=order.get) for g in out if len(g) > 1),
                  key=lambda g: order[g[0]])


def host_copy(obj):
    """A private, contiguous host copy of a tensor/array, same type."""
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        pin = obj.device.type == "cuda"
        h = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=pin)
        h.copy_(obj)
        return h
    if isinstance(obj, Raw):
        return Raw(obj.dtype, obj.shape, np.ascontiguousarray(obj.data).copy())
    return np.ascontiguousarray(obj).copy()


def copy_into(dst, src):
    """Writes host copy src back into the caller's dst (any device)."""
    torch = _torch()
    if torch is not None and isinstance(dst, torch.Tensor):
        dst.copy_(src, non_blocking=False)
    elif isinstance(dst, Raw):
        np.copyto(dst.data, src.data)
    else:
        np.copyto(dst, src)


def _raw_bytes(obj):
    from .model import _describe
    _, _, ptr, nbytes, _ = _describe("", obj, False)
    return _view_bytes(ptr, nbytes, obj)


def check_groups(groups_, host):
    """Raises FerryError(ERR_ARG) unless every group's host copies hold the
    same bytes (the version can live in the caller's one storage)."""
    for g in groups_:
        first = _raw_bytes(host[g[0]])
        for other in g[1:]:
            if not np.array_equal(first, _raw_bytes(host[other])):
                raise FerryError(ERR_ARG, "tensors %r and %r share one storage here, but the "
                                 "new version gives them different values (the published "
                                 "model is not tied the same way); nothing was changed"
                                 % (g[0], other))


def write_back(tensors, host, groups_):
    """Copies every host copy (host[name] not the caller's own object) into
    the caller's tensor, each storage of a group once."""
    head = {n: g[0] for g in groups_ for n in g}
    done = set()
    for name, t in tensors.items():
        h = host[name]
        if h is t or head.get(name, name) in done:
            continue
        done.add(head.get(name, name))
        copy_into(t, h)
