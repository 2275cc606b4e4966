"""int4g layout 2 ("rowmajor-k8-interleaved-asym", spec §9.5): the numpy dequantization reference against an
element-by-element transcription of the spec's rule, the reader's and writer's layout-2 paths and their named
errors, and the CPU backend on the golden vector."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nanoqwen_format import (LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM, DType, NanoqwenWriter, TensorSpec,
                             dequantize_int4_asym_reference, dequantize_int4_reference, int4_nbytes, open_file,
                             pack_int4_reference)
from nanoqwen_format import errors as E
from nanoqwen_format.constants import INT4_PERM
from nanoqwen_format.tensors import int4_parts

VECTOR = Path(__file__).resolve().parents[1] / "spec" / "vectors" / "tiny_int4_asym.nanoqwen"
QP = "model.layers.0.self_attn.q_proj.weight"
OP = "model.layers.0.self_attn.o_proj.weight"   # layout 1 in the same file


def _random_parts(rng, n, k, g):
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.2, size=(n, k // g)).astype(np.float16)
    zeros = rng.integers(0, 16, size=(n, k // g), dtype=np.uint8)
    return codes, scales, zeros


def _dequant_by_the_spec(qweight, scales, zeros, g):
    """§9.5 transcribed one element at a time: nibble i of word j holds k = 8j + INT4_PERM[i];
    w'[n][k] = float32(s[n][k // g]) * float32(u - z[n][k // g])."""
    n, words = qweight.shape
    out = np.empty((n, words * 8), np.float32)
    for r in range(n):
        for j in range(words):
            w = int(qweight[r, j])
            for i in range(8):
                k = 8 * j + INT4_PERM[i]
                u = (w >> (4 * i)) & 0xF
                out[r, k] = np.float32(scales[r, k // g]) * np.float32(u - int(zeros[r, k // g]))
    return out


@pytest.mark.parametrize("g", [32, 64, 128, 256])
def test_asym_reference_matches_the_spec_rule_bit_for_bit(g):
    rng = np.random.default_rng(g)
    n, k = 5, 2 * g
    codes, scales, zeros = _random_parts(rng, n, k, g)
    q = pack_int4_reference(codes)
    got = dequantize_int4_asym_reference(q, scales, zeros, g)
    want = _dequant_by_the_spec(q, scales, zeros, g)
    assert np.any(got != 0) and np.any(got < 0) and np.any(got > 0)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_asym_with_every_zero_8_is_layout_1():
    rng = np.random.default_rng(3)
    codes, scales, _ = _random_parts(rng, 4, 64, 32)
    q = pack_int4_reference(codes)
    eights = np.full(scales.shape, 8, np.uint8)
    np.testing.assert_array_equal(dequantize_int4_asym_reference(q, scales, eights, 32).view(np.uint32),
                                  dequantize_int4_reference(q, scales, 32).view(np.uint32))


def test_asym_reference_rejects_bad_inputs():
    q = pack_int4_reference(np.zeros((2, 32), np.uint8) + 3)
    s = np.ones((2, 1), np.float16)
    with pytest.raises(ValueError, match="zeros"):
        dequantize_int4_asym_reference(q, s, np.full((2, 1), 16, np.uint8), 32)
    with pytest.raises(ValueError, match="zeros"):
        dequantize_int4_asym_reference(q, s, np.zeros((2, 2), np.uint8), 32)
    with pytest.raises(ValueError, match="scales"):
        dequantize_int4_asym_reference(q, s.astype(np.float32), np.zeros((2, 1), np.uint8), 32)


def test_byte_map_of_both_layouts():
    # q_proj of the golden vector: 512 B qweight, 64 B scales, 64 B padding, 32 B zeros (spec §15)
    p = int4_parts(32, 32, 32, LAYOUT_INT4_ROWMAJOR_K8_ASYM)
    assert (p.qweight_nbytes, p.scales_offset, p.scales_nbytes, p.zeros_offset, p.zeros_nbytes, p.nbytes) == (
        512, 512, 64, 640, 32, 672)
    assert int4_nbytes(50, 64, 32) == 1864 == int4_parts(50, 64, 32).nbytes   # layout 1, spec §15
    assert int4_nbytes(50, 64, 32, LAYOUT_INT4_ROWMAJOR_K8_ASYM) == 1920 + 100
    with pytest.raises(ValueError, match="layout_id"):
        int4_parts(4, 32, 32, 3)


def test_reader_parts_and_dequantization():
    with open_file(VECTOR) as f:
        assert f.tensors[QP].layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM
        assert f.tensors[OP].layout_id == LAYOUT_INT4_ROWMAJOR_K8
        q, s, z = f.int4_asym(QP)
        assert q.shape == (32, 4) and s.shape == (32, 1) and z.shape == (32, 1) and z.dtype == np.uint8
        assert z.max() <= 15 and len(np.unique(z)) > 4
        want = _dequant_by_the_spec(q, s, z, 32)
        np.testing.assert_array_equal(f.float32(QP).view(np.uint32), want.view(np.uint32))
        # the accessor of the other layout refuses, so no caller reads asymmetric codes as symmetric ones
        with pytest.raises(TypeError, match="layout 1, found layout 2"):
            f.int4(QP)
        with pytest.raises(TypeError, match="layout 2, found layout 1"):
            f.int4_asym(OP)


def _rewrite(tmp_path, replace):
    """Copy the golden vector through NanoqwenWriter; replace(name, spec, parts) may change q_proj's parts."""
    out = tmp_path / "copy.nanoqwen"
    with open_file(VECTOR) as f:
        specs = [TensorSpec(t.name, t.dtype, t.shape, t.group_size, t.layout_id) for t in f.tensors.values()]
        with NanoqwenWriter(out, f.config, specs, []) as w:
            for spec in specs:
                t = f.tensors[spec.name]
                if t.dtype != DType.INT4G:
                    w.write_tensor(spec.name, f.array(spec.name))
                elif t.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                    w.write_int4(spec.name, *replace(spec.name, f.int4_asym(spec.name)))
                else:
                    w.write_int4(spec.name, *f.int4(spec.name))
    return out


def test_writer_reproduces_the_golden_vector(tmp_path):
    out = _rewrite(tmp_path, lambda name, parts: parts)
    assert out.read_bytes() == VECTOR.read_bytes()


@pytest.mark.parametrize("case, error, match", [
    ("zeros-16", E.BadZero, "zero point"),
    ("zeros-missing", E.WriterUsageError, "expected zeros"),
    ("zeros-int16", E.WriterUsageError, "zeros: dtype"),
    ("zeros-shape", E.WriterUsageError, "zeros: shape"),
])
def test_writer_rejects_bad_zero_points_and_leaves_nothing(tmp_path, case, error, match):
    def replace(name, parts):
        q, s, z = parts
        if name != QP:
            return parts
        if case == "zeros-16":
            z = z.copy()
            z[3, 0] = 16
            return q, s, z
        if case == "zeros-missing":
            return q, s
        if case == "zeros-int16":
            return q, s, z.astype(np.int16)
        return q, s, np.zeros((32, 2), np.uint8)
    with pytest.raises(error, match=match):
        _rewrite(tmp_path, replace)
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_zeros_for_layout_1(tmp_path):
    with open_file(VECTOR) as f:
        specs = [TensorSpec(t.name, t.dtype, t.shape, t.group_size, t.layout_id) for t in f.tensors.values()]
        with pytest.raises(E.WriterUsageError, match="expected no zeros"):
            with NanoqwenWriter(tmp_path / "x.nanoqwen", f.config, specs, []) as w:
                for spec in specs:
                    if spec.name == OP:
                        q, s = f.int4(OP)
                        w.write_int4(OP, q, s, np.zeros(s.shape, np.uint8))
                    elif spec.dtype != DType.INT4G:
                        w.write_tensor(spec.name, f.array(spec.name))
                    else:
                        w.write_int4(spec.name, *f.int4_asym(spec.name))
    assert list(tmp_path.iterdir()) == []


def test_cpu_backend_runs_the_golden_vector_as_its_json_says():
    """The golden vector (layouts 1 and 2 in one file) on the CPU backend, oracle and fast: every q_proj output of a
    fresh random input within float32 rounding of the JSON's dequantized weights (the whole model: test_cpu_asym)."""
    from nanoqwen_rt.backends.cpu import CPUBackend
    from nanoqwen_rt.backends.cpu.backend import Linear
    rng = np.random.default_rng()
    with open_file(VECTOR) as f:
        w = dequantize_int4_asym_reference(*f.int4_asym(QP), 32).astype(np.float64)
        x = rng.standard_normal((3, 32)).astype(np.float32)
        lin = Linear(f, QP)
        np.testing.assert_allclose(lin(x), x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)
    for numerics in ("oracle", "fast"):
        with CPUBackend(VECTOR, numerics=numerics) as be:
            assert np.isfinite(be.logits_all(np.array([1, 2, 3], np.int32))).all()


def test_info_shows_the_layout():
    from nanoqwen_rt.cli.info import file_info, format_info
    d = file_info(str(VECTOR), verify_checksums=True)
    by_name = {t["name"]: t for t in d["tensors"]}
    assert by_name[QP]["int4_layout"] == 2 and by_name[OP]["int4_layout"] == 1
    assert by_name["model.embed_tokens.weight"]["int4_layout"] is None
    text = format_info(d)
    assert any(QP in line and "int4g/g32/asym" in line for line in text.splitlines())
    assert any(OP in line and "int4g/g32 " in line for line in text.splitlines())
