"""Export path for RoPE written with complex numbers (``torch.view_as_complex``, ``torch.polar``).

ONNX has no complex arithmetic, and torch.onnx translates only a few complex ATen ops. This module
rewrites an exported program so that every complex tensor ``z`` of shape ``[...]`` becomes a real
tensor ``[..., 2]`` holding ``(z.real, z.imag)`` — the layout of ``torch.view_as_real`` — and every
complex op becomes real arithmetic on those pairs::

    view_as_complex(x)  ->  x                  view_as_real(z)   ->  z
    polar(r, θ)         ->  stack(r cos θ, r sin θ)
    z * w               ->  stack(a c - b d, a d + b c)            z * real  ->  z * real[..., None]
    view/reshape/expand ->  same with a trailing 2;  slice/select/unsqueeze/permute/cat -> dims remapped

How: the program (already traced by ``torch.export``) is replayed by an :class:`torch.fx.Interpreter`
that applies the rules above, and that replay is exported again; the second program has no complex
tensor left. Complex buffers (e.g. a Llama-style ``freqs_cis`` table) become real ``[..., 2]`` buffers.
Complex graph inputs or outputs are not supported (return ``torch.view_as_real(...)``); any other
complex op raises :class:`posenc.errors.ExportError` naming it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn

from posenc.errors import ExportError

aten = torch.ops.aten
_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}


def _is_complex_value(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_complex()


def has_complex(program: torch.export.ExportedProgram) -> bool:
    """Whether any value of the exported program is a complex tensor."""
    return any(_is_complex_value(node.meta.get("val")) for node in program.graph.nodes)


def _complex_rank(node: Any) -> int:
    return node.meta["val"].dim()


def _dim(dim: int, rank: int) -> int:
    """A dim of the complex tensor (rank ``rank``) as a dim of its real pair tensor."""
    return dim + rank if dim < 0 else dim


def _pair(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
    return torch.stack((re, im), dim=-1)


def _mul(a: torch.Tensor, a_cx: bool, b: Any, b_cx: bool) -> torch.Tensor:
    if a_cx and b_cx:
        ar, ai, br, bi = a[..., 0], a[..., 1], b[..., 0], b[..., 1]
        return _pair(ar * br - ai * bi, ar * bi + ai * br)
    z, other = (a, b) if a_cx else (b, a)
    if isinstance(other, torch.Tensor):
        return z * other.unsqueeze(-1)
    if isinstance(other, complex):
        return _pair(z[..., 0] * other.real - z[..., 1] * other.imag, z[..., 0] * other.imag + z[..., 1] * other.real)
    return z * other


class _Rewriter(fx.Interpreter):
    """Replays a graph with complex values held as real ``[..., 2]`` pairs."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.complex_nodes = {n for n in module.graph.nodes if _is_complex_value(n.meta.get("val"))}

    def _flags(self, args: Any) -> Any:
        return fx.node.map_aggregate(args, lambda a: isinstance(a, fx.Node) and a in self.complex_nodes)

    def run_node(self, n: fx.Node) -> Any:
        if n.op == "placeholder" and n in self.complex_nodes:
            raise ExportError(
                f"input {n.name!r} is complex; pass torch.view_as_real(x) and call torch.view_as_complex inside."
            )
        if n.op == "get_attr":
            value = super().run_node(n)
            return torch.view_as_real(value).clone() if _is_complex_value(value) else value
        if n.op == "output":
            flags = self._flags(n.args)
            if any(_flatten(flags)):
                raise ExportError("the module returns a complex tensor; return torch.view_as_real(z) instead.")
            return super().run_node(n)
        if n.op != "call_function":
            return super().run_node(n)
        flags = self._flags(n.args)
        touches_complex = n in self.complex_nodes or any(_flatten(flags)) or any(_flatten(self._flags(n.kwargs)))
        if not touches_complex:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return self._translate(n, args, kwargs, flags)

    def _translate(self, n: fx.Node, args: tuple, kwargs: dict, flags: tuple) -> Any:
        target = n.target
        x = args[0] if args else None
        rank = _complex_rank(n.args[0]) if n.args and flags[0] is True else 0
        handler = _HANDLERS.get(target)
        if handler is None:
            raise ExportError(
                f"complex op {target} is not supported by posenc's complex-to-real rewrite; write the rotation with "
                f"posenc.functional.apply_rope (cos/sin tables) or with the ops listed in posenc.export.complex."
            )
        return handler(n, x, rank, args, kwargs, flags)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _flatten(item)]
    if isinstance(value, dict):
        return [v for item in value.values() for v in _flatten(item)]
    return [value]


def _h_identity(n, x, rank, args, kwargs, flags):
    return x


def _h_polar(n, x, rank, args, kwargs, flags):
    magnitude, angle = args[0], args[1]
    return _pair(magnitude * torch.cos(angle), magnitude * torch.sin(angle))


def _h_complex(n, x, rank, args, kwargs, flags):
    return _pair(args[0], args[1])


def _h_part(index: int) -> Callable[..., Any]:
    def handler(n, x, rank, args, kwargs, flags):
        return x[..., index]

    return handler


def _h_mul(n, x, rank, args, kwargs, flags):
    return _mul(args[0], bool(flags[0]), args[1], bool(flags[1]))


def _h_div(n, x, rank, args, kwargs, flags):
    if flags[1]:
        raise ExportError("division by a complex tensor is not supported by the complex-to-real rewrite.")
    other = args[1]
    return x / (other.unsqueeze(-1) if isinstance(other, torch.Tensor) else other)


def _h_addsub(sign: float) -> Callable[..., Any]:
    def handler(n, x, rank, args, kwargs, flags):
        if not (flags[0] and flags[1]):
            raise ExportError("adding a real to a complex tensor is not supported; add complex tensors only.")
        alpha = kwargs.get("alpha", 1)
        return args[0] + sign * alpha * args[1]

    return handler


def _h_neg(n, x, rank, args, kwargs, flags):
    return -x


def _h_conj(n, x, rank, args, kwargs, flags):
    return _pair(x[..., 0], -x[..., 1])


def _h_view(n, x, rank, args, kwargs, flags):
    return torch.reshape(x, [*args[1], 2])


def _h_expand(n, x, rank, args, kwargs, flags):
    return x.expand(*args[1], 2)


def _h_unsqueeze(n, x, rank, args, kwargs, flags):
    dim = args[1]
    return x.unsqueeze(dim + rank + 1 if dim < 0 else dim)


def _h_squeeze(n, x, rank, args, kwargs, flags):
    if len(args) < 2:
        shape = n.args[0].meta["val"].shape
        dims = [i for i, size in enumerate(shape) if size == 1]
    else:
        dims = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
    result = x
    for dim in sorted((_dim(d, rank) for d in dims), reverse=True):
        result = result.squeeze(dim)
    return result


def _h_slice(n, x, rank, args, kwargs, flags):
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    rest = list(args[2:])
    return aten.slice.Tensor(x, _dim(dim, rank), *rest)


def _h_select(n, x, rank, args, kwargs, flags):
    return x.select(_dim(args[1], rank), args[2])


def _h_permute(n, x, rank, args, kwargs, flags):
    return x.permute(*[_dim(d, rank) for d in args[1]], rank)


def _h_transpose(n, x, rank, args, kwargs, flags):
    return x.transpose(_dim(args[1], rank), _dim(args[2], rank))


def _h_flatten(n, x, rank, args, kwargs, flags):
    start = _dim(args[1] if len(args) > 1 else 0, rank)
    end = _dim(args[2] if len(args) > 2 else -1, rank)
    return x.flatten(start, end)


def _h_cat(n, x, rank, args, kwargs, flags):
    tensors, tensor_flags = args[0], flags[0]
    if not all(tensor_flags):
        raise ExportError("concatenating complex and real tensors is not supported by the complex-to-real rewrite.")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    return torch.cat(list(tensors), dim=_dim(dim, _complex_rank(n.args[0][0])))


def _h_index(n, x, rank, args, kwargs, flags):
    indices = args[1]
    if len(indices) > rank:
        raise ExportError("indexing a complex tensor with more indices than its rank is not supported.")
    return aten.index.Tensor(x, list(indices))


def _h_to(n, x, rank, args, kwargs, flags):
    dtype = kwargs.get("dtype")
    if dtype is None and len(args) > 1 and isinstance(args[1], torch.dtype):
        dtype = args[1]
    if dtype is None:
        return x.clone()
    if dtype.is_complex:
        real = _REAL_OF[dtype]
        if flags[0]:
            return x.to(real)
        return _pair(x.to(real), torch.zeros_like(x, dtype=real))  # real -> complex: imaginary part 0
    if not flags[0]:
        return x.to(dtype)
    return x[..., 0].to(dtype)  # complex -> real cast keeps the real part, as torch does


def _h_clone(n, x, rank, args, kwargs, flags):
    return x.clone()


def _h_drop(n, x, rank, args, kwargs, flags):
    return None  # metadata assertions about the complex dtype no longer apply


_HANDLERS: dict[Any, Callable[..., Any]] = {
    aten.view_as_complex.default: _h_identity,
    aten.view_as_real.default: _h_identity,
    aten.polar.default: _h_polar,
    aten.complex.default: _h_complex,
    aten.real.default: _h_part(0),
    aten.imag.default: _h_part(1),
    aten.mul.Tensor: _h_mul,
    aten.mul.Scalar: _h_mul,
    operator.mul: _h_mul,
    aten.div.Tensor: _h_div,
    aten.div.Scalar: _h_div,
    aten.add.Tensor: _h_addsub(1.0),
    aten.sub.Tensor: _h_addsub(-1.0),
    aten.neg.default: _h_neg,
    aten.conj.default: _h_conj,
    aten._conj.default: _h_conj,
    aten.conj_physical.default: _h_conj,
    aten.resolve_conj.default: _h_identity,
    aten.resolve_neg.default: _h_identity,
    aten.alias.default: _h_identity,
    aten.lift_fresh_copy.default: _h_clone,
    aten.detach.default: _h_identity,
    aten.view.default: _h_view,
    aten.reshape.default: _h_view,
    aten._unsafe_view.default: _h_view,
    aten.expand.default: _h_expand,
    aten.unsqueeze.default: _h_unsqueeze,
    aten.squeeze.default: _h_squeeze,
    aten.squeeze.dim: _h_squeeze,
    aten.squeeze.dims: _h_squeeze,
    aten.slice.Tensor: _h_slice,
    aten.select.int: _h_select,
    aten.permute.default: _h_permute,
    aten.transpose.int: _h_transpose,
    aten.flatten.using_ints: _h_flatten,
    aten.cat.default: _h_cat,
    aten.index.Tensor: _h_index,
    aten._to_copy.default: _h_to,
    aten.to.dtype: _h_to,
    aten.type_as.default: _h_to,
    aten.clone.default: _h_clone,
    aten._assert_tensor_metadata.default: _h_drop,
    aten.contiguous.default: _h_clone,
}


class RealArithmetic(nn.Module):
    """A module that runs an exported program's graph with complex values as real pairs.

    Args:
        program: a program from :func:`torch.export.export` that contains complex values.
    """

    def __init__(self, program: torch.export.ExportedProgram) -> None:
        super().__init__()
        self.graph_module = program.module()
        for module in self.graph_module.modules():
            for name, buffer in list(module.named_buffers(recurse=False)):
                if buffer is not None and buffer.is_complex():
                    module.register_buffer(name, torch.view_as_real(buffer).clone())
            for name, param in list(module.named_parameters(recurse=False)):
                if param.is_complex():
                    setattr(module, name, nn.Parameter(torch.view_as_real(param.detach()).clone(), requires_grad=False))

    def forward(self, *args: torch.Tensor) -> Any:
        outputs = _Rewriter(self.graph_module).run(*args)
        return tuple(outputs) if isinstance(outputs, (list, tuple)) else outputs


def realify_complex(
    program: torch.export.ExportedProgram,
    args: Sequence[torch.Tensor],
    dynamic_shapes: Sequence[Any] | None,
) -> torch.export.ExportedProgram:
    """Re-export ``program`` with complex values rewritten into real arithmetic (see module docstring).

    Args:
        program: the exported program (it may contain complex values).
        args: the sample inputs it was exported with (positional).
        dynamic_shapes: the same dynamic shapes (one entry per positional input).

    Returns:
        ``program`` unchanged when it has no complex value, else an equivalent program without any.

    Raises:
        ExportError: a complex op outside the supported set, or complex graph inputs/outputs.
    """
    if not has_complex(program):
        return program
    wrapper = RealArithmetic(program)
    shapes = None if dynamic_shapes is None else {"args": tuple(dynamic_shapes)}
    try:
        rewritten = torch.export.export(wrapper, tuple(args), dynamic_shapes=shapes, strict=False)
    except ExportError:
        raise
    except Exception as exc:  # torch raises many exception types here
        raise ExportError(f"rewriting complex ops into real arithmetic failed: {exc}") from exc
    if has_complex(rewritten):
        raise ExportError("complex values remain after the complex-to-real rewrite; please report this model.")
    return rewritten
