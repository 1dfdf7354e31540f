"""RoPE written with complex numbers (seeds 000 and 002) exports through the complex-to-real rewrite."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from posenc import ExportError, functional
from posenc.export import export_module, ort_session

DIM, HEADS = 16, 4


class FreqsCisRope(nn.Module):
    """Meta's Llama reference code (github.com/meta-llama/llama, model.py): a complex ``freqs_cis`` buffer from
    torch.polar, q/k viewed as complex pairs."""

    def __init__(self, max_positions: int = 64, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, DIM, 2).float() / DIM))
        freqs = torch.outer(torch.arange(max_positions).float(), inv_freq)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(freqs), freqs))

    def forward(self, xq: torch.Tensor, xk: torch.Tensor, position_ids: torch.Tensor):
        freqs_cis = self.freqs_cis[position_ids].unsqueeze(1)  # [B, 1, S, D/2] complex
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)


class PolarRope(nn.Module):
    """ "Llama旋转位置编码代码实现及详解" (https://blog.csdn.net/weixin_40732165/article/details/143635503): angles
    from the positions, torch.polar in the forward, complex product, view_as_real."""

    def __init__(self, base: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("theta", 1.0 / (base ** (torch.arange(0, DIM, 2, dtype=torch.float64) / DIM)))

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        all_theta = position_ids.to(torch.float64).unsqueeze(-1) * self.theta
        rotation = torch.polar(torch.ones_like(all_theta), all_theta).to(torch.complex64).unsqueeze(1)
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        rotated = torch.view_as_real(pairs * rotation)
        return rotated.reshape(*x.shape).type_as(x)


def _apply_rope_reference(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    inv_freq, _ = functional.rope_inv_freq(DIM)
    cos, sin = functional.rope_cos_sin(torch.from_numpy(positions), inv_freq, dtype=torch.float64)
    x64 = torch.from_numpy(x).double()
    return functional.apply_rope(x64, cos.unsqueeze(1), sin.unsqueeze(1), "interleaved").numpy()


def _no_complex(path) -> None:
    model = onnx.load(str(path))
    complex_types = {onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128}
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    assert not {v.type.tensor_type.elem_type for v in values} & complex_types
    assert not {i.data_type for i in model.graph.initializer} & complex_types


def test_freqs_cis_rope_exports_and_matches_apply_rope(tmp_path) -> None:
    module = FreqsCisRope().eval()
    q, k = torch.randn(2, HEADS, 5, DIM), torch.randn(2, 2, 5, DIM)
    positions = torch.arange(5).repeat(2, 1) + 3
    path = export_module(
        module,
        (q, k, positions),
        tmp_path / "freqs_cis.onnx",
        input_names=["q", "k", "position_ids"],
        output_names=["q_rot", "k_rot"],
        dynamic_dims=[{0: "batch", 2: "seq"}, {0: "batch", 2: "seq"}, {0: "batch", 1: "seq"}],
    )
    _no_complex(path)
    session = ort_session(path)
    rng = np.random.default_rng(1)
    q2 = rng.standard_normal((3, HEADS, 9, DIM)).astype(np.float32)
    k2 = rng.standard_normal((3, 2, 9, DIM)).astype(np.float32)
    pos2 = np.repeat((np.arange(9) + 40)[None], 3, axis=0).astype(np.int64)
    q_rot, k_rot = session.run(None, {"q": q2, "k": k2, "position_ids": pos2})
    np.testing.assert_allclose(q_rot, _apply_rope_reference(q2, pos2), atol=3e-5, rtol=1e-4)
    np.testing.assert_allclose(k_rot, _apply_rope_reference(k2, pos2), atol=3e-5, rtol=1e-4)


def test_polar_rope_exports_and_matches_apply_rope(tmp_path) -> None:
    module = PolarRope().eval()
    x, positions = torch.randn(2, HEADS, 4, DIM), torch.arange(4).repeat(2, 1)
    path = export_module(
        module,
        (x, positions),
        tmp_path / "polar.onnx",
        input_names=["x", "position_ids"],
        output_names=["x_rot"],
        dynamic_dims=[{0: "batch", 2: "seq"}, {0: "batch", 1: "seq"}],
    )
    _no_complex(path)
    x2 = np.random.default_rng(2).standard_normal((1, HEADS, 11, DIM)).astype(np.float32)
    pos2 = (np.arange(11) + 1000)[None].astype(np.int64)
    (out,) = ort_session(path).run(None, {"x": x2, "position_ids": pos2})
    np.testing.assert_allclose(out, _apply_rope_reference(x2, pos2), atol=3e-5, rtol=1e-4)


class RealToComplexCast(nn.Module):
    """A real tensor cast to complex (imaginary part 0), rotated by e^{i angle}, and cast back to real."""

    def forward(self, x: torch.Tensor, angle: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = x.to(torch.complex64) * torch.polar(torch.ones_like(angle), angle)
        return torch.view_as_real(z), z.to(torch.float32)


@pytest.mark.filterwarnings("ignore:Casting complex values to real discards the imaginary part")
def test_casts_between_real_and_complex_export(tmp_path) -> None:
    module = RealToComplexCast()
    path = export_module(
        module,
        (torch.randn(2, 4), torch.randn(2, 4)),
        tmp_path / "cast.onnx",
        input_names=["x", "angle"],
        output_names=["z", "real"],
    )
    _no_complex(path)
    x, angle = torch.randn(2, 4), torch.randn(2, 4)
    z, real = ort_session(path).run(None, {"x": x.numpy(), "angle": angle.numpy()})
    expected_z, expected_real = module(x, angle)
    np.testing.assert_allclose(z, expected_z.numpy(), atol=1e-6)
    np.testing.assert_allclose(real, expected_real.numpy(), atol=1e-6)


class ComplexExp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(torch.exp(z)).flatten(-2)


def test_unsupported_complex_op_names_itself(tmp_path) -> None:
    with pytest.raises(ExportError, match="exp"):
        export_module(ComplexExp(), (torch.randn(2, 8),), tmp_path / "exp.onnx", input_names=["x"], output_names=["y"])
    assert list(tmp_path.iterdir()) == []
