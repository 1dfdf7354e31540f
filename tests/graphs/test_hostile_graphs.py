"""Runaway graphs bounded: ``optimize``, ``inspect`` and ``validate`` refuse, with the reason and within seconds, a Loop
of 2**62 iterations, a chain past the node bound, inputs declared too large to feed and ops of an unknown domain
(the parity check cannot run them: refused, never skipped in silence)."""

from __future__ import annotations

import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from posenc.cli import main
from posenc.errors import ModelFileError
from posenc.export.runtime import check_model_file
from posenc.export.screen import MAX_NODES
from posenc.graphs.inspect import inspect_model
from posenc.graphs.optimize import optimize_file

OPSET = [helper.make_opsetid("", 23)]


def _save(graph: onnx.GraphProto, path: Path, extra: tuple = ()) -> Path:
    onnx.save(helper.make_model(graph, opset_imports=[*OPSET, *extra]), path)
    return path


def loop_model(path: Path, trips: int) -> Path:
    """``y = x0 + trips`` by a Loop of ``trips`` constant iterations."""
    body = helper.make_graph(
        [helper.make_node("Add", ["x_in", "one"], ["x_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [1])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "x0"], ["y"], body=body)],
        "loop",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [
            helper.make_tensor("M", TensorProto.INT64, [], [trips]),
            helper.make_tensor("cond", TensorProto.BOOL, [], [1]),
        ],
    )
    return _save(graph, path)


def chain_model(path: Path, nodes: int) -> Path:
    chain = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(nodes)]
    graph = helper.make_graph(
        chain,
        "chain",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(f"t{nodes}", TensorProto.FLOAT, [1, 4])],
    )
    return _save(graph, path)


def one_op(path: Path, op: str, dims: list[int], domain: str = "") -> Path:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], domain=domain)],
        "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    return _save(graph, path, (helper.make_opsetid(domain, 1),) if domain else ())


def no_check(*args: object) -> dict:
    raise AssertionError("the parity check must not run on a graph it cannot run")


def test_a_loop_of_2_62_iterations_is_refused_by_every_reader(tmp_path: Path) -> None:
    path = loop_model(tmp_path / "loop.onnx", 2**62)
    started = time.perf_counter()
    with pytest.raises(ModelFileError, match=r"trip count 4,611,686,018,427,387,904.*65,536"):
        optimize_file(path, tmp_path / "out.onnx", "ort-cpu", check=no_check)
    with pytest.raises(ModelFileError, match="Loop node"):
        inspect_model(path)
    with pytest.raises(ModelFileError, match="Loop node"):
        check_model_file(path)  # validate's gate, before any session
    assert time.perf_counter() - started < 10
    assert not (tmp_path / "out.onnx").exists()
    check_model_file(loop_model(tmp_path / "short.onnx", 3))  # a bounded loop is read


def test_a_chain_past_the_node_bound_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = chain_model(tmp_path / "chain.onnx", MAX_NODES + 1)
    started = time.perf_counter()
    assert main(["optimize", str(path), "-o", str(tmp_path / "out.onnx"), "--target", "ort-cpu"]) == 2
    assert main(["inspect", str(path), "--no-tensorrt"]) == 2
    assert time.perf_counter() - started < 10
    err = capsys.readouterr().err
    assert err.count(f"more than {MAX_NODES:,} nodes") == 2


def test_inputs_declared_too_large_to_feed_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = one_op(tmp_path / "huge.onnx", "Relu", [2**40, 2**40])
    assert main(["optimize", str(path), "-o", str(tmp_path / "out.onnx"), "--target", "ort-cpu"]) == 2
    err = capsys.readouterr().err
    assert "input 'x' is declared [1099511627776, 1099511627776]" in err
    assert "Traceback" not in err


def test_an_op_of_an_unknown_domain_is_reported_not_passed_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parity check cannot run ``com.evil::EvilOp``: refused, naming it; with --no-parity the user asked for no
    check, and the manifest records none."""
    path = one_op(tmp_path / "evil.onnx", "EvilOp", [1, 4], domain="com.evil")
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(path), "-o", str(out), "--target", "ort-cpu"]) == 2
    assert "com.evil::EvilOp" in capsys.readouterr().err
    assert not out.exists()
    assert main(["optimize", str(path), "-o", str(out), "--target", "ort-cpu", "--no-parity"]) == 0
    assert "parity" not in capsys.readouterr().out
