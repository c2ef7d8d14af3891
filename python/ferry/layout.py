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
  megatron_qkv
             Megatron-LM's linear_qkv of a GQA model: per query group, that
             group's q rows (heads_per_group * head_dim), then its k rows,
             then its v rows (head_dim each); TP rank r holds groups
             [r*G/tp, (r+1)*G/tp), i.e. rows [r*n/tp, (r+1)*n/tp) of the
             interleaved tensor.  Made of separate q/k/v checkpoint tensors
             or of one fused [q; k; v] tensor (add_megatron_qkv)
  experts_w13, experts_w2
             the fused experts of one MoE layer as vLLM's FusedMoE holds
             them: w13 [E_local, 2*I/mtp, H] (each expert's gate rows, then
             its up rows) and w2 [E_local, H, I/mtp], made of a fused 3-D
             checkpoint tensor ([E, 2I, H] / [E, H, I]) or of per-expert
             ones (experts.N.gate_proj / up_proj [I, H], down_proj [H, I]).
             Expert parallelism: the rank holds experts
             [ep_rank*E/ep, (ep_rank+1)*E/ep), each TP-split inside over
             the mtp = tp_size/ep_size ranks of its EP group (SGLang's
             moe_tp; ep_size = tp_size is vLLM's EP, ep_size = 1 plain TP)

Every tensor is seen as 2-D (rows = shape[0], cols = the product of the
other dims), as ferry_shard.h sees it.  A rank's piece of one checkpoint
tensor is a REGION (tensor, row range, col range); region element (row,
col) lands at flat index offset + row * pitch + col of the engine
parameter, where pitch is the region's width (so the changed positions
the library reports for a region index the parameter directly) except in
expert regions that interleave (a TP slice of fused experts: gate and up
rows of each expert alternate; w2's [E, H, I] view needs one region per
hidden row, as the library's 2-D view of it has rows = experts).

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

import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import ERR_ARG, ERR_SHAPE_MISMATCH, FerryError
from .fp8 import BLOCK, SCALE_SUFFIX, scale_shape
from ._typing import Tensors

COLUMN, ROW, FUSED, VOCAB, REPLICATED = "column", "row", "fused", "vocab", "replicated"
EXPERTS_W13, EXPERTS_W2 = "experts_w13", "experts_w2"
MEGATRON_QKV = "megatron_qkv"
KINDS = (COLUMN, ROW, FUSED, VOCAB, REPLICATED, EXPERTS_W13, EXPERTS_W2, MEGATRON_QKV)
# Per-expert checkpoint tensors and fused ones (vLLM's FusedMoE names).
_PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_EXPERTS = re.compile(r"^(.*\.experts)\.(w13_weight|w2_weight)$")


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
    on, row-major, rows x cols, `pitch` elements from one row's start to
    the next's (default: cols, contiguous)."""

    __slots__ = ("source", "row_begin", "row_end", "col_begin", "col_end", "param", "offset", "pitch")

    def __init__(self, source: str, rows: Tuple[int, int], cols: Tuple[int, int], param: str,
                 offset: int, pitch: Optional[int] = None) -> None:
        self.source = source
        self.row_begin, self.row_end = rows
        self.col_begin, self.col_end = cols
        self.param, self.offset = param, offset
        self.pitch = self.cols if pitch is None else int(pitch)

    @property
    def contiguous(self) -> bool:
        return self.pitch == self.cols or self.rows <= 1

    def positions(self, flat: Any) -> Any:
        """Region flat positions (row * cols + col, a torch int64 tensor)
        as positions in the engine parameter, offset included."""
        if self.contiguous:
            return flat + self.offset
        return flat // self.cols * self.pitch + flat % self.cols + self.offset

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
        return "Region(%s[%d:%d, %d:%d] -> %s+%d%s)" % (
            self.source, self.row_begin, self.row_end, self.col_begin, self.col_end, self.param,
            self.offset, "" if self.contiguous else " pitch %d" % self.pitch)


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
    parallel world and this rank; ep_size: the expert-parallel groups
    the experts are split over (it divides tp_size; each group of
    moe_tp = tp_size / ep_size consecutive ranks holds one expert range,
    TP-split inside: ep_rank = rank // moe_tp, moe_tp_rank = rank % moe_tp).
    add() describes one parameter and checks it against shapes at once
    (FerryError ERR_ARG naming the parameter when a split does not divide,
    PatchError ERR_SHAPE_MISMATCH when fused parts disagree)."""

    def __init__(self, shapes: Mapping[str, Sequence[int]], tp_size: int, rank: int,
                 ep_size: int = 1) -> None:
        if int(tp_size) < 1 or not 0 <= int(rank) < int(tp_size):
            raise FerryError(ERR_ARG, "layout: rank %r of tp_size %r" % (rank, tp_size))
        if int(ep_size) < 1 or int(tp_size) % int(ep_size):
            raise FerryError(ERR_ARG, "layout: ep_size %r does not divide tp_size %r" % (ep_size, tp_size))
        self.shapes = {k: tuple(int(d) for d in v) for k, v in shapes.items()}
        self.tp_size, self.rank = int(tp_size), int(rank)
        self.ep_size = int(ep_size)
        self.moe_tp = self.tp_size // self.ep_size
        self.ep_rank, self.moe_tp_rank = divmod(self.rank, self.moe_tp)
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

    def _split(self, param, source, n, what, split=None):
        size, rank, world = split or (self.tp_size, self.rank, "tp_size")
        if n % size:
            raise FerryError(ERR_ARG, "layout: parameter %r: %s of %r is %d, not divisible by "
                             "%s %d" % (param, what, source, n, world, size))
        k = n // size
        return rank * k, (rank + 1) * k

    def add(self, name: str, kind: str, sources: Union[str, Iterable[str]], moe: bool = False) -> Param:
        """Describes engine parameter `name` of `kind` (KINDS) made of
        checkpoint tensors `sources` (one name, or a list for FUSED; for
        EXPERTS_W13 one fused [E, 2I, H] tensor or every expert's gate and
        up, [gate_0, up_0, gate_1, ...]; for EXPERTS_W2 one [E, H, I]
        tensor or every expert's down).  moe: a column/row/fused split over
        the moe_tp ranks of this rank's EP group (a per-expert parameter of
        an expert this rank holds), not over tp_size."""
        if kind not in KINDS:
            raise FerryError(ERR_ARG, "layout: parameter %r: unknown kind %r" % (name, kind))
        if name in self.params:
            raise FerryError(ERR_ARG, "layout: parameter %r described twice" % name)
        sources = [sources] if isinstance(sources, str) else list(sources)
        if kind == MEGATRON_QKV:
            raise FerryError(ERR_ARG, "layout: parameter %r: %s needs the query group count: "
                             "use add_megatron_qkv(name, sources, num_query_groups)" % (name, kind))
        if kind in (EXPERTS_W13, EXPERTS_W2):
            return self._experts(name, kind, sources)
        if not sources or (kind != FUSED and len(sources) != 1):
            raise FerryError(ERR_ARG, "layout: parameter %r: %s takes %s checkpoint tensor"
                             % (name, kind, "one or more" if kind == FUSED else "exactly one"))
        split = (self.moe_tp, self.moe_tp_rank, "moe_tp") if moe else None
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
                r, c = (0, rows), self._split(name, src, cols, "dim 1", split)
                eshape = (rows, c[1] - c[0])
            else:
                if not shape:
                    raise FerryError(ERR_ARG, "layout: parameter %r: %r is a scalar and cannot "
                                     "be split" % (name, src))
                r, c = self._split(name, src, rows, "dim 0", split), (0, cols)
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

    def add_megatron_qkv(self, name: str, sources: Union[str, Iterable[str]], num_query_groups: int,
                         head_dim: Optional[int] = None) -> Param:
        """Describes engine parameter `name` as Megatron-LM holds linear_qkv
        (weight or bias) of a GQA model: for each of its num_query_groups
        groups G, the group's q rows (heads_per_group * head_dim), its k
        rows (head_dim), its v rows (head_dim); this rank holds groups
        [rank*G/tp_size, (rank+1)*G/tp_size) in that order (Megatron's
        rows [rank*n/tp_size, (rank+1)*n/tp_size) of the interleaved
        tensor).  sources: [q, k, v] checkpoint tensors (HF names), or one
        fused tensor whose rows are all q, then all k, then all v (vLLM's
        qkv_proj); head_dim is read from k's rows for separate tensors and
        is required for a fused one.  One region per group and part, each
        whole rows: bit-identical slices of the published q/k/v."""
        sources = [sources] if isinstance(sources, str) else list(sources)
        if name in self.params:
            raise FerryError(ERR_ARG, "layout: parameter %r described twice" % name)
        try:
            G = int(num_query_groups)
            hd = None if head_dim is None else int(head_dim)
        except (TypeError, ValueError):
            raise FerryError(ERR_ARG, "layout: parameter %r: num_query_groups %r / head_dim %r are "
                             "not integers" % (name, num_query_groups, head_dim)) from None
        if G < 1 or (hd is not None and hd < 1):
            raise FerryError(ERR_ARG, "layout: parameter %r: num_query_groups %d and head_dim %s must "
                             "be positive" % (name, G, hd))
        if len(sources) not in (1, 3):
            raise FerryError(ERR_ARG, "layout: parameter %r: %s takes [q, k, v] or one fused qkv "
                             "checkpoint tensor, not %d" % (name, MEGATRON_QKV, len(sources)))
        shapes = [self._shape(name, src) for src in sources]
        if any(src + SCALE_SUFFIX in self.shapes for src in sources):
            raise FerryError(ERR_ARG, "layout: parameter %r: FP8 megatron_qkv (%s) is not supported yet"
                             % (name, SCALE_SUFFIX))
        if any(not sh for sh in shapes):
            raise FerryError(ERR_ARG, "layout: parameter %r: %r is a scalar and cannot be split"
                             % (name, sources[[not sh for sh in shapes].index(True)]))
        tail = shapes[0][1:]
        for src, sh in zip(sources, shapes):
            if sh[1:] != tail:
                raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r: q/k/v differ past dim 0 "
                                 "(%r is %s, %r %s)" % (name, src, list(sh), sources[0], list(shapes[0])))
        cols = _2d(shapes[0])[1]
        if len(sources) == 3:
            nq, nk, nv = (sh[0] for sh in shapes)
            if nk != nv or nk % G:
                raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r: k %r has %d rows and v %r %d: "
                                 "both must be num_query_groups %d x head_dim"
                                 % (name, sources[1], nk, sources[2], nv, G))
            if hd is None:
                hd = nk // G
            elif nk != G * hd:
                raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r: k %r has %d rows, not "
                                 "num_query_groups %d x head_dim %d" % (name, sources[1], nk, G, hd))
            base = [(sources[0], 0), (sources[1], 0), (sources[2], 0)]
        else:
            if hd is None:
                raise FerryError(ERR_ARG, "layout: parameter %r: a fused qkv tensor %r needs head_dim"
                                 % (name, sources[0]))
            n = shapes[0][0]
            nk = nv = G * hd
            nq = n - 2 * nk
            if nq <= 0:
                raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r: fused %r has %d rows, not more "
                                 "than k + v = 2 x %d groups x head_dim %d" % (name, sources[0], n, G, hd))
            base = [(sources[0], 0), (sources[0], nq), (sources[0], nq + nk)]
        if nq % (G * hd):
            raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r: q %r has %d rows, not a multiple of "
                             "num_query_groups %d x head_dim %d" % (name, sources[0], nq, G, hd))
        if G % self.tp_size:
            raise FerryError(ERR_ARG, "layout: parameter %r: num_query_groups %d is not divisible by "
                             "tp_size %d (Megatron needs whole query groups on each rank)"
                             % (name, G, self.tp_size))
        qg = nq // G                      # q rows of one group: heads_per_group * head_dim
        g0, g1 = self.rank * G // self.tp_size, (self.rank + 1) * G // self.tp_size
        regions, offset = [], 0
        for g in range(g0, g1):
            for (src, at), k in zip(base, (qg, hd, hd)):
                reg = Region(src, (at + g * k, at + (g + 1) * k), (0, cols), name, offset)
                regions.append(reg)
                offset += reg.nelem
        eshape = ((g1 - g0) * (qg + 2 * hd),) + tuple(tail)
        p = Param(name, MEGATRON_QKV, sources, eshape, regions)
        self.params[name] = p
        self.regions += regions
        return p

    def _experts(self, name, kind, sources):
        """add() of EXPERTS_W13 / EXPERTS_W2: this rank's expert range,
        TP-split inside over moe_tp, in FusedMoE's engine shape."""
        w13 = kind == EXPERTS_W13
        shapes = [self._shape(name, src) for src in sources]
        if any(src + SCALE_SUFFIX in self.shapes for src in sources):
            raise FerryError(ERR_ARG, "layout: parameter %r: FP8 experts (%s) are not supported yet"
                             % (name, SCALE_SUFFIX))
        fused = len(sources) == 1 and len(shapes[0]) == 3
        if fused:
            if w13:
                E, I2, H = shapes[0]
                if I2 % 2:
                    raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r: %r is %s, dim 1 (gate "
                                     "and up rows) is odd" % (name, sources[0], list(shapes[0])))
                inter = I2 // 2
            else:
                E, H, inter = shapes[0]
        else:
            per = 2 if w13 else 1
            want = shapes[0] if shapes[0] and len(shapes[0]) == 2 else None
            bad = [s for s, sh in zip(sources, shapes) if want is None or sh != want]
            if bad or len(sources) % per:
                raise FerryError(ERR_SHAPE_MISMATCH, "layout: parameter %r: %s needs one 3-D fused tensor "
                                 "or 2-D per-expert tensors of one shape%s (%r is %s)"
                                 % (name, kind, " in gate/up pairs" if w13 else "",
                                    (bad or sources)[0], list(self.shapes[(bad or sources)[0]])))
            E = len(sources) // per
            inter, H = want if w13 else want[::-1]
        e0, e1 = self._split(name, sources[0] if fused else "%d experts" % E, E, "the expert count",
                             (self.ep_size, self.ep_rank, "ep_size"))
        a, b = self._split(name, sources[0], inter, "the expert intermediate size",
                           (self.moe_tp, self.moe_tp_rank, "moe_tp (tp_size / ep_size)"))
        k, n = b - a, e1 - e0
        if w13:
            eshape = (n, 2 * k, H)
            if fused and k == inter:
                regions = [Region(sources[0], (e0, e1), (0, I2 * H), name, 0)]
            elif fused:   # gate rows a..b, then up rows I+a..I+b, of each expert
                regions = [Region(sources[0], (e0, e1), ((j * inter + a) * H, (j * inter + b) * H), name,
                                  j * k * H, pitch=2 * k * H) for j in (0, 1)]
            else:
                regions = [Region(sources[2 * e + j], (a, b), (0, H), name, (2 * (e - e0) + j) * k * H)
                           for e in range(e0, e1) for j in (0, 1)]
        else:
            eshape = (n, H, k)
            if fused and k == inter:
                regions = [Region(sources[0], (e0, e1), (0, H * inter), name, 0)]
            elif fused:   # the library's view of [E, H, I] is E x (H*I): one region per hidden row
                regions = [Region(sources[0], (e0, e1), (h * inter + a, h * inter + b), name, h * k,
                                  pitch=H * k) for h in range(H)]
            else:
                regions = [Region(sources[e], (0, H), (a, b), name, (e - e0) * H * k) for e in range(e0, e1)]
        p = Param(name, kind, sources, eshape, regions)
        self.params[name] = p
        self.regions += regions
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
    def llama(cls, shapes: Mapping[str, Sequence[int]], tp_size: int, rank: int,
              fuse_qkv: Union[bool, str] = True, fuse_gate_up: bool = True, prefix: str = "model.",
              num_query_groups: Optional[int] = None) -> Layout:
        """The vLLM-style layout of a Llama-family checkpoint (names like
        model.layers.N.self_attn.q_proj.weight): q/k/v fused into
        self_attn.qkv_proj.weight and gate/up into mlp.gate_up_proj.weight
        (column-parallel; or kept apart with fuse_*=False), o_proj and
        down_proj row-parallel, embed_tokens and lm_head vocabulary-
        parallel, every other tensor (norms) replicated.  Engine names are
        the checkpoint's, the fused ones as above.  fuse_qkv="megatron"
        (with num_query_groups, the KV head count) makes qkv_proj
        Megatron-LM's interleaved linear_qkv instead (MEGATRON_QKV: per
        query group q, k, v; see add_megatron_qkv), weight and bias."""
        lay = cls(shapes, tp_size, rank)
        lay._llama_rules(shapes, fuse_qkv, fuse_gate_up, prefix, num_query_groups)
        return lay

    @classmethod
    def moe(cls, shapes: Mapping[str, Sequence[int]], tp_size: int, rank: int, ep_size: Optional[int] = None,
            fuse_experts: bool = True, fuse_qkv: Union[bool, str] = True, fuse_gate_up: bool = True,
            prefix: str = "model.", num_query_groups: Optional[int] = None) -> Layout:
        """The layout of a MoE checkpoint (Qwen-MoE, DeepSeek, Mixtral
        names) on an engine of tp_size ranks whose experts are split over
        ep_size EP groups (default tp_size: vLLM's expert parallelism,
        whole experts; 1: experts TP-split like a dense MLP; between:
        SGLang's moe_tp = tp_size / ep_size inside each expert).

        Experts come as per-expert tensors (...mlp.experts.N.gate_proj /
        up_proj / down_proj.weight) or fused 3-D ones (...mlp.experts.
        w13_weight [E, 2I, H], w2_weight [E, H, I]).  Either way the engine
        holds them fused (EXPERTS_W13 / EXPERTS_W2 as ...mlp.experts.
        w13_weight / w2_weight) unless fuse_experts=False, which keeps
        per-expert parameters (only the experts of this rank's range,
        gate/up fused as fuse_gate_up says) for per-expert checkpoints.
        Everything else follows llama(): the router (mlp.gate.weight) and
        norms replicated, shared experts (mlp.shared_expert(s).*_proj)
        split like the dense MLP over all tp_size ranks."""
        lay = cls(shapes, tp_size, rank, tp_size if ep_size is None else ep_size)
        groups: Dict[str, Dict[str, Any]] = {}
        dense = {}
        for name, shp in shapes.items():
            m = _PER_EXPERT.match(name)
            if m:
                groups.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = name
                continue
            m = _FUSED_EXPERTS.match(name)
            if m:
                groups.setdefault(m.group(1), {})[m.group(2)] = name
            else:
                dense[name] = shp
        lay._llama_rules(dense, fuse_qkv, fuse_gate_up, prefix, num_query_groups)
        for base, g in groups.items():
            w13, w2 = base + ".w13_weight", base + ".w2_weight"
            if "w13_weight" in g or "w2_weight" in g:
                for leaf in ("w13_weight", "w2_weight"):
                    if leaf not in g or len(g) != 2:
                        raise FerryError(ERR_ARG, "layout: %s: the checkpoint has %s; fused experts need "
                                         "w13_weight and w2_weight and nothing else" % (base, sorted(g)))
                lay.add(w13, EXPERTS_W13, g["w13_weight"])
                lay.add(w2, EXPERTS_W2, g["w2_weight"])
                continue
            E = 1 + max(e for part in g.values() for e in part)
            for e in range(E):
                for m in ("gate_proj", "up_proj", "down_proj"):
                    if e not in g.get(m, {}):
                        raise FerryError(ERR_ARG, "layout: %s: the checkpoint has no %s.%d.%s.weight (experts "
                                         "0..%d need gate_proj, up_proj and down_proj)" % (base, base, e, m, E - 1))
            if fuse_experts:
                lay.add(w13, EXPERTS_W13, [g[m][e] for e in range(E) for m in ("gate_proj", "up_proj")])
                lay.add(w2, EXPERTS_W2, [g["down_proj"][e] for e in range(E)])
                continue
            e0, e1 = lay._split(base, "%d experts" % E, E, "the expert count", (lay.ep_size, lay.ep_rank, "ep_size"))
            for e in range(e0, e1):
                gate, up, down = (g[m][e] for m in ("gate_proj", "up_proj", "down_proj"))
                if fuse_gate_up:
                    lay.add("%s.%d.gate_up_proj.weight" % (base, e), FUSED, [gate, up], moe=True)
                else:
                    lay.add(gate, COLUMN, gate, moe=True)
                    lay.add(up, COLUMN, up, moe=True)
                lay.add(down, ROW, down, moe=True)
        return lay

    def _llama_rules(self, shapes, fuse_qkv, fuse_gate_up, prefix, num_query_groups=None):
        """llama()'s parameters of the tensors `shapes` names."""
        lay = self
        done = set()
        if fuse_qkv not in (True, False, "megatron"):
            raise FerryError(ERR_ARG, "layout: fuse_qkv %r: True, False or \"megatron\"" % (fuse_qkv,))
        if (fuse_qkv == "megatron") != (num_query_groups is not None):
            raise FerryError(ERR_ARG, "layout: num_query_groups goes with fuse_qkv=\"megatron\" "
                             "(and it needs it): fuse_qkv %r, num_query_groups %r" % (fuse_qkv, num_query_groups))
        for name in shapes:
            if name in done or (name.endswith(SCALE_SUFFIX) and name[:-len(SCALE_SUFFIX)] in shapes):
                continue                  # FP8 scales: with their tensor's parameter
            base, leaf = name.rsplit(".", 1) if "." in name else ("", name)
            mod = base.rsplit(".", 1)[-1]
            parent = base[:-len(mod)]
            if mod in ("q_proj", "k_proj", "v_proj") and fuse_qkv:
                parts = [parent + m + "." + leaf for m in ("q_proj", "k_proj", "v_proj")]
                if fuse_qkv == "megatron":
                    lay.add_megatron_qkv(parent + "qkv_proj." + leaf, parts, num_query_groups)
                else:
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
            flat = torch.empty(p.nelem, dtype=full[p.regions[0].source].dtype)
            for r in p.regions:
                piece = full[r.source].reshape(_2d(full[r.source].shape))[r.row_begin:r.row_end,
                                                                          r.col_begin:r.col_end]
                flat.as_strided((r.rows, r.cols), (r.pitch, 1), r.offset).copy_(piece)
            out[name] = flat.reshape(p.shape)
        return out
