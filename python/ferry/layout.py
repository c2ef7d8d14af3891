"""Engine layout of a tensor-parallel model: which slices of which
checkpoint tensors one rank's engine parameters hold, and where.

An inference engine keeps a TP model in its own layout, not the
checkpoint's:

  column     split on dim 0 (q/k/v, gate/up, any column-parallel linear):
             the rank holds rows [r*n/tp, (r+1)*n/tp)
  row        split on dim 1 (o_proj, down_proj): all rows, columns
             [r*c/tp, (r+1)*c/tp) (2-D tensors only)
  fused      a column-parallel parameter made of several checkpoint
             tensors (qkv = [q, k, v], gate_up = [gate, up]): each split on
             dim 0, the rank's pieces concatenated in order
  vocab      vocabulary-parallel embedding or head: rows split, as column
  replicated the whole tensor on every rank (norms, biases of row-parallel
             layers)

Every tensor is seen as 2-D (rows = shape[0], cols = the product of the
other dims), as ferry_shard.h sees it.  A rank's piece of one checkpoint
tensor is a REGION (tensor, row range, col range) and always spans the
engine parameter's full width, so region element (row, col) lands at flat
index offset + row * cols + col of the engine parameter: the changed
positions the library reports for a region index the parameter directly.

    lay = ferry.layout.Layout.llama(shapes, tp_size=2, rank=1)
    lay.check_engine(engine_params)         # names, shapes: before any I/O
    lay.regions                             # what the island rank pulls

FP8 checkpoints (include/ferry_quant.h): a checkpoint tensor NAME with a
NAME_scale_inv beside it (one FP32 scale per 128 x 128 block) gives its
engine parameter P a companion parameter P_scale_inv, split the same way
on the block grid (rows / cols divided by 128), so that each rank's codes
and scales dequantize (ferry.fp8.dequantize) to exactly its slice of the
full dequantized tensor.  A split whose bounds are not on multiples of
128 (or a fused part that ends inside a block) would cut a block that has
one scale for both sides: refused, naming the parameter.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple, Union

from .errors import ERR_ARG, ERR_SHAPE_MISMATCH, FerryError
from .fp8 import BLOCK, SCALE_SUFFIX, scale_shape
from ._typing import Tensors

COLUMN, ROW, FUSED, VOCAB, REPLICATED = "column", "row", "fused", "vocab", "replicated"
KINDS = (COLUMN, ROW, FUSED, VOCAB, REPLICATED)


def _2d(shape: Sequence[int]) -> Tuple[int, int]:
    rows = int(shape[0]) if len(shape) else 1
    cols = 1
    for d in shape[1:]:
        cols *= int(d)
    return rows, cols


class Region:
    """One slice of a checkpoint tensor held by this rank: rows
    [row_begin, row_end) x cols [col_begin, col_end) of `source` (2-D
    view), stored in engine parameter `param` from flat element `offset`
    on, row-major, rows x cols."""

    __slots__ = ("source", "row_begin", "row_end", "col_begin", "col_end", "param", "offset")

    def __init__(self, source: str, rows: Tuple[int, int], cols: Tuple[int, int], param: str,
                 offset: int) -> None:
        self.source = source
        self.row_begin, self.row_end = rows
        self.col_begin, self.col_end = cols
        self.param, self.offset = param, offset

    @property
    def rows(self) -> int:
        return self.row_end - self.row_begin

    @property
    def cols(self) -> int:
        return self.col_end - self.col_begin

    @property
    def nelem(self) -> int:
        return self.rows * self.cols

    def __repr__(self) -> str:
        return "Region(%s[%d:%d, %d:%d] -> %s+%d)" % (self.source, self.row_begin, self.row_end,
                                                     self.col_begin, self.col_end, self.param,
                                                     self.offset)


class Param:
    """One engine parameter: name, kind, the checkpoint tensors it is made
    of, its shape on this rank, and its regions (in offset order)."""

    __slots__ = ("name", "kind", "sources", "shape", "regions", "scale")

    def __init__(self, name: str, kind: str, sources: Iterable[str], shape: Sequence[int],
                 regions: List[Region]) -> None:
        self.name, self.kind, self.sources = name, kind, tuple(sources)
        self.shape, self.regions = tuple(shape), regions
        self.scale = None  # FP8: the name of its block-scale parameter

    @property
    def nelem(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class Layout:
    """The engine parameters of one TP rank.

    shapes: checkpoint tensor name -> full shape (a state_dict's shapes, a
    safetensors header's, a config's); tp_size, rank: the engine's tensor
    parallel world and this rank.  add() describes one parameter and
    checks it against shapes at once (FerryError ERR_ARG naming the
    parameter when a split does not divide, PatchError ERR_SHAPE_MISMATCH
    when fused parts disagree)."""

    def __init__(self, shapes: Mapping[str, Sequence[int]], tp_size: int, rank: int) -> None:
        if int(tp_size) < 1 or not 0 <= int(rank) < int(tp_size):
            raise FerryError(ERR_ARG, "layout: rank %r of tp_size %r" % (rank, tp_size))
        self.shapes = {k: tuple(int(d) for d in v) for k, v in shapes.items()}
        self.tp_size, self.rank = int(tp_size), int(rank)
        self.params: Dict[str, Param] = {}
        self.regions: List[Region] = []

    def dims(self, source: str) -> Tuple[int, int]:
        """(rows, cols) of checkpoint tensor `source` in its 2-D view."""
        return _2d(self.shapes[source])

    def _shape(self, param, source):
        if source not in self.shapes:
            raise FerryError(ERR_ARG, "layout: parameter %r: checkpoint has no tensor %r"
                             % (param, source))
        return self.shapes[source]

    def _split(self, param, source, n, what):
        if n % self.tp_size:
            raise FerryError(ERR_ARG, "layout: parameter %r: %s of %r is %d, not divisible by "
                             "tp_size %d" % (param, what, source, n, self.tp_size))
        k = n // self.tp_size
        return self.rank * k, (self.rank + 1) * k

    def add(self, name: str, kind: str, sources: Union[str, Iterable[str]]) -> Param:
        """Describes engine parameter `name` of `kind` (KINDS) made of
        checkpoint tensors `sources` (one name, or a list for FUSED)."""
        if kind not in KINDS:
            raise FerryError(ERR_ARG, "layout: parameter %r: unknown kind %r" % (name, kind))
        if name in self.params:
            raise FerryError(ERR_ARG, "layout: parameter %r described twice" % name)
        sources = [sources] if isinstance(sources, str) else list(sources)
        if not sources or (kind != FUSED and len(sources) != 1):
            raise FerryError(ERR_ARG, "layout: parameter %r: %s takes %s checkpoint tensor"
                             % (name, kind, "one or more" if kind == FUSED else "exactly one"))
        regions, offset, rows_total, tail = [], 0, 0, None
        for src in sources:
            shape = self._shape(name, src)
            rows, cols = _2d(shape)
            if kind == REPLICATED:
                r, c, eshape = (0, rows), (0, cols), shape
            elif kind == ROW:
                if len(shape) != 2:
                    raise FerryError(ERR_ARG, "layout: parameter %r: row-parallel needs a 2-D "
                                     "tensor, %r is %s" % (name, src, list(shape)))
                r, c = (0, rows), self._split(name, src, cols, "dim 1")
                eshape = (rows, c[1] - c[0])
            else:
                if not shape:
                    raise FerryError(ERR_ARG, "layout: parameter %r: %r is a scalar and cannot "
                                     "be split" % (name, src))
                r, c = self._split(name, src, rows, "dim 0"), (0, cols)
                if tail is not None and shape[1:] != tail:
                    raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r: fused parts "
                                     "differ past dim 0 (%r is %s, the first part %s)"
                                     % (name, src, list(shape), [None] + list(tail)))
                tail = shape[1:]
                rows_total += r[1] - r[0]
                eshape = (rows_total,) + tuple(shape[1:])
            reg = Region(src, r, c, name, offset)
            regions.append(reg)
            offset += reg.nelem
        scales = self._scales(name, kind, sources, regions)  # checked before anything is kept
        p = Param(name, kind, sources, eshape, regions)
        self.params[name] = p
        self.regions += regions
        if scales is not None:
            p.scale = scales.name
            self.params[scales.name] = scales
            self.regions += scales.regions
        return p

    def _scales(self, name, kind, sources, regions):
        """Parameter name's block scales (a Param over the sources'
        NAME_scale_inv, regions on the block grid), or None when its
        checkpoint tensors are not FP8."""
        fp8 = [s + SCALE_SUFFIX in self.shapes for s in sources]
        if not any(fp8):
            return None
        sname = name + SCALE_SUFFIX
        if not all(fp8):
            raise FerryError(ERR_ARG, "layout: parameter %r: fused parts mix FP8 tensors (with %s) and others"
                             % (name, SCALE_SUFFIX))
        if sname in self.params:
            raise FerryError(ERR_ARG, "layout: parameter %r described twice (the scales of %r)" % (sname, name))
        out, offset = [], 0
        for i, reg in enumerate(regions):
            src = reg.source
            rows, cols = self.dims(src)
            sshape = self.shapes[src + SCALE_SUFFIX]
            if len(self.shapes[src]) != 2 or tuple(sshape) != scale_shape(rows, cols):
                raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r: %r is %s, its %r %s (a %dx%d block "
                                 "grid of a 2-D tensor needs %s)" % (name, src, list(self.shapes[src]),
                                                                    src + SCALE_SUFFIX, list(sshape), BLOCK,
                                                                    BLOCK, list(scale_shape(rows, cols))))
            for what, lo, hi, n in (("rows", reg.row_begin, reg.row_end, rows),
                                    ("cols", reg.col_begin, reg.col_end, cols)):
                if any(b % BLOCK and b != n for b in (lo, hi)):
                    raise FerryError(ERR_ARG, "layout: parameter %r: rank %d of %d holds %s %d..%d of %r, "
                                     "which cuts a %dx%d FP8 block (one scale for both sides): a split of an "
                                     "FP8 tensor needs bounds on multiples of %d"
                                     % (name, self.rank, self.tp_size, what, lo, hi, src, BLOCK, BLOCK, BLOCK))
            if kind == FUSED and i + 1 < len(regions) and reg.rows % BLOCK:
                raise FerryError(ERR_ARG, "layout: parameter %r: fused part %r gives %d rows, which end inside "
                                 "a %dx%d FP8 block of the fused parameter" % (name, src, reg.rows, BLOCK, BLOCK))
            sreg = Region(src + SCALE_SUFFIX, (reg.row_begin // BLOCK, -(-reg.row_end // BLOCK)),
                          (reg.col_begin // BLOCK, -(-reg.col_end // BLOCK)), sname, offset)
            out.append(sreg)
            offset += sreg.nelem
        shape = (sum(r.rows for r in out), out[0].cols)
        return Param(sname, kind, [s + SCALE_SUFFIX for s in sources], shape, out)

    # ------------------------------------------------------------------
    @classmethod
    def llama(cls, shapes: Mapping[str, Sequence[int]], tp_size: int, rank: int, fuse_qkv: bool = True,
              fuse_gate_up: bool = True, prefix: str = "model.") -> Layout:
        """The vLLM-style layout of a Llama-family checkpoint (names like
        model.layers.N.self_attn.q_proj.weight): q/k/v fused into
        self_attn.qkv_proj.weight and gate/up into mlp.gate_up_proj.weight
        (column-parallel; or kept apart with fuse_*=False), o_proj and
        down_proj row-parallel, embed_tokens and lm_head vocabulary-
        parallel, every other tensor (norms) replicated.  Engine names are
        the checkpoint's, the fused ones as above."""
        lay = cls(shapes, tp_size, rank)
        done = set()
        for name in shapes:
            if name in done or (name.endswith(SCALE_SUFFIX) and name[:-len(SCALE_SUFFIX)] in shapes):
                continue                  # FP8 scales: with their tensor's parameter
            base, leaf = name.rsplit(".", 1) if "." in name else ("", name)
            mod = base.rsplit(".", 1)[-1]
            parent = base[:-len(mod)]
            if mod in ("q_proj", "k_proj", "v_proj") and fuse_qkv:
                parts = [parent + m + "." + leaf for m in ("q_proj", "k_proj", "v_proj")]
                lay.add(parent + "qkv_proj." + leaf, FUSED, parts)
                done.update(parts)
            elif mod in ("gate_proj", "up_proj") and fuse_gate_up:
                parts = [parent + m + "." + leaf for m in ("gate_proj", "up_proj")]
                lay.add(parent + "gate_up_proj." + leaf, FUSED, parts)
                done.update(parts)
            elif mod in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
                lay.add(name, COLUMN, name)
            elif mod in ("o_proj", "down_proj") and leaf == "weight":
                lay.add(name, ROW, name)
            elif name in (prefix + "embed_tokens.weight", "lm_head.weight"):
                lay.add(name, VOCAB, name)
            else:
                lay.add(name, REPLICATED, name)
            done.add(name)
        return lay

    # ------------------------------------------------------------------
    def check_engine(self, params: Tensors) -> None:
        """Checks the engine's tensors (mapping name -> tensor) against
        this layout before anything is fetched or written: every parameter
        present, of its shape, contiguous (PatchError ERR_SHAPE_MISMATCH /
        FerryError ERR_ARG naming it)."""
        for name, p in self.params.items():
            t = params.get(name)
            if t is None:
                raise FerryError(ERR_ARG, "layout: the engine has no parameter %r" % name)
            if tuple(t.shape) != p.shape:
                raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r is %s in the engine, "
                                 "the layout gives %s (tp_size %d, rank %d)"
                                 % (name, list(t.shape), list(p.shape), self.tp_size, self.rank))
            if not t.is_contiguous():
                raise FerryError(ERR_ARG, "layout: parameter %r is not contiguous" % name)
        extra = sorted(set(params) - set(self.params))
        if extra:
            raise FerryError(ERR_ARG, "layout: the engine parameter %r is not in the layout"
                             % extra[0])

    def shard(self, full: Mapping[str, Any]) -> Dict[str, Any]:
        """This rank's engine parameters cut from full checkpoint tensors
        (mapping name -> tensor): what a correct apply must produce, and a
        way to load an engine from a checkpoint."""
        import torch
        out = {}
        for name, p in self.params.items():
            pieces = [full[r.source].reshape(_2d(full[r.source].shape))
                      [r.row_begin:r.row_end, r.col_begin:r.col_end].reshape(-1)
                      for r in p.regions]
            out[name] = torch.cat(pieces).reshape(p.shape).contiguous()
        return out
