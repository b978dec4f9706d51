"""The rooted and list-form collectives of the data plane: gather, scatter, all_to_all over lists,
reduce_scatter over lists, coalesced all_gather of lists.

These are the CPU collectives ProcessGroupGloo implements beyond the ones ``fabric.py`` has. They
use the same machinery (one slot per rank and op, metadata exchange, mismatch detection), so a
mismatch names every rank's call, and a root out of range is refused on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from simulator.errors import CollectiveMismatch
from simulator.payload import misfit, nbytes, offsets, tdesc
from simulator.reduction import dtype_name, reduce_into, unsupported
from simulator.wire import Splits

if TYPE_CHECKING:
    from simulator.control import ControlPlane


def _same(tensors: list[Tensor], like: Tensor, what: str) -> str | None:
    bad = [tdesc(t) for t in tensors if t.shape != like.shape or t.dtype != like.dtype]
    return f"{what} {bad} must all be {tdesc(like)}" if bad else None


class ListCollectives:
    """Mixin of :class:`simulator.fabric.Fabric` (uses its ``_begin``, ``_view`` and lock)."""

    if TYPE_CHECKING:  # provided by Fabric
        n: int
        me: int
        kernel: Any
        _coll_lock: Any
        control: ControlPlane

        def _begin(self, name: str, desc: str, err: str | None, payload: list[Tensor],
                   splits: Splits | None = None) -> Any: ...
        def _view(self, op: Any, j: int, k: int, like: Tensor) -> Tensor: ...
        def _check_root(self, root: int) -> str | None: ...

    def gather(self, outputs: list[Tensor], input: Tensor, root: int) -> None:
        """On the root, outputs[j] := rank j's input; other ranks pass no outputs."""
        err = self._check_root(root)
        if err is None and self.me == root:
            if len(outputs) != self.n:
                err = f"root needs {self.n} output tensors, got {len(outputs)}"
            else:
                err = _same(outputs, input, "output tensors")
        with self._coll_lock:
            o = self._begin("gather", f"gather({tdesc(input)}, root={root})", err, [input])
            if self.me == root:
                for j, out in enumerate(outputs):
                    out.copy_(self._view(o, j, 0, input).view(input.shape))

    def gather_single(self, output: Tensor, input: Tensor, root: int) -> None:
        """On the root, ``output`` := every rank's input concatenated along dim 0."""
        err = self._check_root(root)
        if err is None and self.me == root:
            err = misfit("output", output, "input", input, self.n)
        with self._coll_lock:
            o = self._begin("gather_single", f"gather_single({tdesc(input)}, root={root})", err, [input])
            if self.me == root:
                full = output if output.is_contiguous() else torch.empty(output.shape, dtype=output.dtype)
                flat, m = full.view(-1), input.numel()
                for j in range(self.n):
                    flat[j * m:(j + 1) * m].copy_(self._view(o, j, 0, input))
                if full is not output:
                    output.copy_(full)

    def scatter(self, output: Tensor, inputs: list[Tensor], root: int) -> None:
        """output := the root's inputs[me]; only the root passes inputs."""
        err = self._check_root(root)
        if err is None and self.me == root:
            if len(inputs) != self.n:
                err = f"root needs {self.n} input tensors, got {len(inputs)}"
            else:
                err = _same(inputs, output, "input tensors")
        with self._coll_lock:
            o = self._begin("scatter", f"scatter({tdesc(output)}, root={root})", err,
                            inputs if self.me == root else [])
            o.offs = offsets([nbytes(output)] * self.n)[0]
            output.copy_(self._view(o, root, self.me, output).view(output.shape))

    def all_to_all(self, outputs: list[Tensor], inputs: list[Tensor]) -> None:
        """outputs[j] := rank j's inputs[me]; tensors may differ in size between pairs."""
        err = None
        if len(inputs) != self.n or len(outputs) != self.n:
            err = f"needs {self.n} input and {self.n} output tensors, got {len(inputs)} and {len(outputs)}"
        elif any(t.dtype != inputs[0].dtype for t in [*inputs, *outputs]):
            err = f"tensors must share one dtype: inputs {[tdesc(t) for t in inputs]}, outputs " \
                  f"{[tdesc(t) for t in outputs]}"
        dtype = dtype_name(inputs[0].dtype) if inputs else "?"
        with self._coll_lock:
            o = self._begin("all_to_all", f"all_to_all({dtype})", err, inputs,
                            Splits([list(t.shape) for t in inputs], [list(t.shape) for t in outputs],
                                   [nbytes(t) for t in inputs]))
            g, sp = self.control.g, [m.splits for m in o.metas]  # every pair, so that every member refuses
            bad = [f"rank {g(i)} sends {sp[i].sends[j]} to rank {g(j)}, which expects "
                   f"{sp[j].expects[i]}" for j in range(self.n) for i in range(self.n)
                   if sp[i].sends[j] != sp[j].expects[i]]
            if bad:
                raise CollectiveMismatch(f"{self.control.where(o.seq)}: all_to_all tensor shapes disagree: "
                                         + "; ".join(bad))
            for j, out in enumerate(outputs):
                o.offs = offsets(o.metas[j].splits.nbytes)[0]
                out.copy_(self._view(o, j, self.me, out).view(out.shape))

    def reduce_scatter(self, output: Tensor, inputs: list[Tensor], op: str) -> None:
        """output := op over ranks of their inputs[me]."""
        err = None
        if len(inputs) != self.n:
            err = f"needs {self.n} input tensors, got {len(inputs)}"
        else:
            err = _same(inputs, output, "input tensors") or unsupported(output.dtype, op)
        with self._coll_lock:
            o = self._begin("reduce_scatter", f"reduce_scatter({tdesc(output)}, {op})", err, inputs)
            reduce_into(output, [self._view(o, j, self.me, output).view(output.shape) for j in range(self.n)], op,
                        self.kernel)

    def all_gather_coalesced(self, outputs: list[list[Tensor]], inputs: list[Tensor]) -> None:
        """outputs[j][k] := rank j's inputs[k] (torch's allgather_coalesced layout), in one exchange."""
        err = None
        if len(outputs) != self.n:
            err = f"needs {self.n} output lists, got {len(outputs)}"
        else:
            err = next((e for out in outputs for e in [
                f"output list {[tdesc(t) for t in out]} must match inputs {[tdesc(t) for t in inputs]}"]
                if len(out) != len(inputs) or any(a.shape != b.shape or a.dtype != b.dtype
                                                  for a, b in zip(out, inputs, strict=False))), None)
        with self._coll_lock:
            o = self._begin("all_gather_coalesced",
                            f"all_gather_coalesced({', '.join(map(tdesc, inputs))})", err, inputs)
            for j, out in enumerate(outputs):
                for k, t in enumerate(out):
                    t.copy_(self._view(o, j, k, inputs[k]).view(t.shape))
