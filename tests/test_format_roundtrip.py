"""Round trip of every dtype (incl. int4g g32/g64/g128), blobs, config fields, and interrupted writes."""
import os

import numpy as np
import pytest

from nanoqwen_format import (BlobKind, DType, ModelConfig, NanoqwenFormatError, NanoqwenWriter, TensorSpec,
                             dequantize_int4_reference, expected_tensors, int4_nbytes, open_file)
from nanoqwen_format import errors as E

from format_helpers import TINY, make_random_file, mixed_dtypes, random_payload, specs_for


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16])
def test_roundtrip_plain_dtype(tmp_path, dtype):
    path = tmp_path / "m.nanoqwen"
    specs, payloads = make_random_file(path, dtype_for=lambda n, s: (dtype, 0), seed=int(dtype))
    with open_file(path) as f:
        assert f.config == TINY.canonical()
        assert list(f.tensors) == [s.name for s in specs]
        for s in specs:
            a = f.array(s.name)
            assert a.shape == s.shape and not a.flags.writeable
            np.testing.assert_array_equal(a, payloads[s.name])
            want32 = payloads[s.name]
            if dtype == DType.BF16:
                want32 = (want32.astype(np.uint32) << 16).view(np.float32)
            np.testing.assert_array_equal(f.float32(s.name), want32.astype(np.float32))


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_roundtrip_int4(tmp_path, group_size):
    cfg = ModelConfig(**{**TINY.to_dict(), "hidden_size": 128, "head_dim": 32, "intermediate_size": 256})
    path = tmp_path / "m.nanoqwen"
    specs, payloads = make_random_file(
        path, cfg=cfg, seed=group_size,
        dtype_for=lambda n, s: (DType.INT4G, group_size) if "proj.weight" in n else (DType.F16, 0))
    with open_file(path) as f:
        for s in specs:
            t = f.tensors[s.name]
            if s.dtype != DType.INT4G:
                continue
            n, k = s.shape
            assert (t.group_size, t.layout_id, t.nbytes) == (group_size, 1, int4_nbytes(n, k, group_size))
            q, sc = f.int4(s.name)
            np.testing.assert_array_equal(q, payloads[s.name][0])
            np.testing.assert_array_equal(sc, payloads[s.name][1])
            np.testing.assert_array_equal(f.float32(s.name), dequantize_int4_reference(*payloads[s.name], group_size))
            assert f.array(s.name).shape == (t.nbytes,)


def test_roundtrip_mixed_blobs_and_layout(tmp_path):
    path = tmp_path / "m.nanoqwen"
    blobs = {BlobKind.TOKENIZER_JSON: b'{"x": [1, 2]}', BlobKind.CHAT_TEMPLATE: "héllo {{ x }}".encode(),
             BlobKind.GENERATION_CONFIG: b'{"temperature": 0.7}', BlobKind.PROVENANCE: b'{"repo": "r"}',
             BlobKind.TOKENIZER_CONFIG: b"{}"}
    specs, payloads = make_random_file(path, blobs=blobs)
    size = os.path.getsize(path)
    with open_file(path) as f:
        assert f.file_size == size and f.version == 1
        assert f.blob_json(BlobKind.TOKENIZER_JSON) == {"x": [1, 2]}
        assert f.blob_text(BlobKind.CHAT_TEMPLATE) == "héllo {{ x }}"
        assert f.blob_json(BlobKind.GENERATION_CONFIG) == {"temperature": 0.7}
        assert f.blob(BlobKind.PROVENANCE) == b'{"repo": "r"}'
        assert f.blob_kinds == tuple(blobs)
        offsets = [t.offset for t in f.tensors.values()]
        assert all(o % 128 == 0 for o in offsets) and offsets == sorted(offsets)
        f.verify_checksums()


def test_no_blobs_file_ends_at_last_tensor(tmp_path):
    path = tmp_path / "m.nanoqwen"
    make_random_file(path, blobs={})
    with open_file(path) as f:
        last = list(f.tensors.values())[-1]
        assert f.file_size == last.offset + last.nbytes == os.path.getsize(path)
        assert f.blob(BlobKind.TOKENIZER_JSON) is None and f.blob_json(BlobKind.PROVENANCE) is None


def test_config_roundtrip_all_fields(tmp_path):
    cfg = ModelConfig(arch="llama", n_layers=1, hidden_size=64, intermediate_size=160, n_heads=2, n_kv_heads=1,
                      head_dim=48, vocab_rows=70, max_positions=4096, rope_theta=500000.0, rope_scaling_type="yarn",
                      rope_scaling_factor=4.0, rope_original_max_positions=1024, rms_norm_eps=1e-5,
                      tied_embeddings=True, qkv_bias=False, bos_token_id=0, eos_token_id=69, pad_token_id=-1)
    path = tmp_path / "m.nanoqwen"
    make_random_file(path, cfg=cfg, dtype_for=lambda n, s: (DType.F32, 0))
    with open_file(path) as f:
        assert f.config == cfg.canonical()
        assert f.config.rope_theta == 500000.0 and f.config.rope_scaling_type == "yarn"
        assert f.config.rms_norm_eps == pytest.approx(1e-5, rel=1e-7)  # stored as f32: ~6e-8 relative rounding
        assert "lm_head.weight" not in f.tensors


class Boom(Exception):
    pass


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize("after", [0, 3])
def test_interrupted_write_leaves_nothing(tmp_path, exc, after):
    path = tmp_path / "m.nanoqwen"
    rng = np.random.default_rng(1)
    specs = specs_for(TINY, mixed_dtypes)
    with pytest.raises(exc):
        with NanoqwenWriter(path, TINY, specs, [BlobKind.TOKENIZER_JSON]) as w:
            for s in specs[:after]:
                p = random_payload(s, rng)
                w.write_int4(s.name, *p) if s.dtype == DType.INT4G else w.write_tensor(s.name, p)
            raise exc()
    assert os.listdir(tmp_path) == []


def test_incomplete_write_raises_and_leaves_nothing(tmp_path):
    path = tmp_path / "m.nanoqwen"
    specs = specs_for(TINY)
    with pytest.raises(E.WriterUsageError, match="expected .* tensors"):
        with NanoqwenWriter(path, TINY, specs, []) as w:
            w.write_tensor(specs[0].name, random_payload(specs[0], np.random.default_rng(0)))
    assert os.listdir(tmp_path) == []


def test_existing_target_untouched_on_failure(tmp_path):
    path = tmp_path / "m.nanoqwen"
    path.write_bytes(b"old contents")
    with pytest.raises(Boom):
        with NanoqwenWriter(path, TINY, specs_for(TINY), []):
            raise Boom()
    assert path.read_bytes() == b"old contents" and os.listdir(tmp_path) == ["m.nanoqwen"]


def test_writer_rejects_bad_usage(tmp_path):
    rng = np.random.default_rng(2)
    specs = specs_for(TINY, mixed_dtypes)
    path = tmp_path / "m.nanoqwen"
    with pytest.raises(E.WriterUsageError, match="next tensor"):
        with NanoqwenWriter(path, TINY, specs, []) as w:
            w.write_tensor(specs[1].name, random_payload(specs[1], rng))
    with pytest.raises(E.WriterUsageError, match="dtype expected"):
        with NanoqwenWriter(path, TINY, specs, []) as w:
            w.write_tensor(specs[0].name, np.ones(specs[0].shape, np.float32))   # bf16 spec wants uint16
    with pytest.raises(E.WriterUsageError, match="shape expected"):
        with NanoqwenWriter(path, TINY, specs, []) as w:
            w.write_tensor(specs[0].name, np.ones((3, 3), np.uint16))
    with pytest.raises(E.MissingTensor):
        NanoqwenWriter(path, TINY, specs[:-1], [])
    with pytest.raises(E.UnknownTensorName):
        NanoqwenWriter(path, TINY, specs + [TensorSpec("extra.weight", DType.F16, (3,))], [])
    with pytest.raises(E.ConfigMismatch):
        NanoqwenWriter(path, TINY, [TensorSpec(s.name, s.dtype, (1,) + s.shape[1:], s.group_size) if i == 0 else s
                                     for i, s in enumerate(specs)], [])
    with pytest.raises(E.DuplicateName):
        NanoqwenWriter(path, TINY, specs, [BlobKind.PROVENANCE, BlobKind.PROVENANCE])
    with pytest.raises(E.UnknownBlobKind, match="found 6"):
        NanoqwenWriter(path, TINY, specs, [6])
    with pytest.raises(E.BadBlobEncoding):
        with NanoqwenWriter(path, TINY, specs_for(TINY), [BlobKind.GENERATION_CONFIG]) as w:
            for s in specs_for(TINY):
                w.write_tensor(s.name, random_payload(s, rng))
            w.write_blob(BlobKind.GENERATION_CONFIG, b"{not json")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("blob", [b"\xef\xbb\xbf{}", b'{"a": NaN}', b'{"a": Infinity}', b'{"a": 1, "a": 2}', b""],
                         ids=["bom", "nan", "infinity", "duplicate-key", "empty"])
def test_writer_refuses_blobs_the_reader_rejects(tmp_path, blob):
    """The writer applies the reader's blob content rules (31b, 40, 41): it never writes a file it would reject."""
    rng = np.random.default_rng(7)
    with pytest.raises(E.BadBlobEncoding):
        with NanoqwenWriter(str(tmp_path / "b.nanoqwen"), TINY, specs_for(TINY), [BlobKind.GENERATION_CONFIG]) as w:
            for s in specs_for(TINY):
                w.write_tensor(s.name, random_payload(s, rng))
            w.write_blob(BlobKind.GENERATION_CONFIG, blob)
    assert os.listdir(tmp_path) == []


def test_expected_tensors_names_and_shapes():
    names = expected_tensors(TINY)
    assert names["model.embed_tokens.weight"] == (80, 64)
    assert names["model.layers.1.self_attn.q_proj.weight"] == (64, 64)
    assert names["model.layers.1.self_attn.k_proj.weight"] == (32, 64)
    assert names["model.layers.0.self_attn.v_proj.bias"] == (32,)
    assert names["model.layers.0.self_attn.o_proj.weight"] == (64, 64)
    assert names["model.layers.0.mlp.gate_proj.weight"] == (96, 64)
    assert names["model.layers.0.mlp.down_proj.weight"] == (64, 96)
    assert names["lm_head.weight"] == (80, 64)
    assert len(names) == 1 + 2 * 12 + 2
    tied = ModelConfig(**{**TINY.to_dict(), "tied_embeddings": True, "qkv_bias": False})
    assert "lm_head.weight" not in expected_tensors(tied) and len(expected_tensors(tied)) == 1 + 2 * 9 + 1


def test_int4_nbytes_rule():
    assert int4_nbytes(64, 64, 32) == 2048 + 64 * 2 * 2
    assert int4_nbytes(3, 32, 32) == 128 + 3 * 2        # 48 qweight bytes padded to 128
    assert int4_nbytes(5, 256, 128) == 640 + 5 * 2 * 2


def test_errors_are_format_errors():
    for name in dir(E):
        obj = getattr(E, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj is not NanoqwenFormatError:
            assert issubclass(obj, NanoqwenFormatError), name


def test_writer_streams_one_tensor_at_a_time(tmp_path):
    """Peak traced memory while writing ~10 MB of tensors stays near one tensor (the writer keeps none)."""
    import tracemalloc
    cfg = ModelConfig(arch="qwen2", n_layers=4, hidden_size=256, intermediate_size=512, n_heads=4, n_kv_heads=2,
                      head_dim=64, vocab_rows=512, max_positions=64, rope_theta=1e4, qkv_bias=True)
    specs = specs_for(cfg, lambda n, s: (DType.F32, 0))
    biggest = max(int(np.prod(s.shape)) * 4 for s in specs)             # 512 KiB (embed / lm_head / mlp)
    total = sum(int(np.prod(s.shape)) * 4 for s in specs)
    assert total > 15 * biggest
    rng = np.random.default_rng(4)
    tracemalloc.start()
    try:
        with NanoqwenWriter(tmp_path / "m.nanoqwen", cfg, specs, []) as w:
            for s in specs:
                w.write_tensor(s.name, rng.standard_normal(s.shape, dtype=np.float32))  # made, written, dropped
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # one payload alive at a time (+ one transient copy at most) and 256 KiB of interpreter slack
    assert peak < 2 * biggest + 256 * 1024, (peak, biggest, total)
    with open_file(tmp_path / "m.nanoqwen") as f:
        assert len(f.tensors) == len(specs)


@pytest.mark.parametrize("field,value", [
    ("arch", "gpt2"), ("n_layers", 0), ("n_layers", 2**32), ("hidden_size", 1.5), ("n_heads", True),
    ("n_kv_heads", 3), ("head_dim", 17), ("rope_theta", 0.0), ("rope_theta", float("inf")),
    ("rope_scaling_type", "dynamic"), ("rope_scaling_factor", 2.0), ("rms_norm_eps", 1e300),
    ("rms_norm_eps", 1e-50), ("rms_norm_eps", -1e-6), ("eos_token_id", 80), ("bos_token_id", -5),
    ("tied_embeddings", 1)])
def test_writer_rejects_invalid_config(tmp_path, field, value):
    cfg = ModelConfig(**{**TINY.to_dict(), field: value})
    with pytest.raises(E.ConfigMismatch, match=field):
        NanoqwenWriter(tmp_path / "m.nanoqwen", cfg, specs_for(TINY), [])
    assert os.listdir(tmp_path) == []


def test_config_accepts_numpy_ints_and_int_floats(tmp_path):
    cfg = ModelConfig(**{**TINY.to_dict(), "n_layers": np.int64(2), "hidden_size": np.uint32(64),
                         "rope_theta": 10000, "rope_scaling_type": "yarn", "rope_scaling_factor": 4,
                         "rope_original_max_positions": np.int32(32)})
    path = tmp_path / "m.nanoqwen"
    make_random_file(path, cfg=cfg, dtype_for=lambda n, s: (DType.F16, 0))
    with open_file(path) as f:
        assert f.config == cfg.canonical()
        assert f.config.rope_scaling_factor == 4.0 and isinstance(f.config.n_layers, int)


@pytest.mark.parametrize("bad", [np.inf, np.nan, -0.5, -0.0])
def test_writer_rejects_bad_int4_scales(tmp_path, bad):
    rng = np.random.default_rng(6)
    specs = specs_for(TINY, mixed_dtypes)
    with pytest.raises(E.BadScale):
        with NanoqwenWriter(tmp_path / "m.nanoqwen", TINY, specs, []) as w:
            for s in specs:
                p = random_payload(s, rng)
                if s.dtype == DType.INT4G:
                    p[1][1, 0] = bad
                    w.write_int4(s.name, *p)
                else:
                    w.write_tensor(s.name, p)
    assert os.listdir(tmp_path) == []


def test_writer_rejects_config_values_the_file_cannot_hold(tmp_path):
    """A linear factor that rounds to 0 in binary32 (the reader would reject the stored 0.0) and a rope_theta past
    binary64 (math.isfinite would raise OverflowError): ConfigMismatch at construction, nothing written."""
    for fields in ({"rope_scaling_type": "linear", "rope_scaling_factor": 1e-50}, {"rope_theta": 10**400}):
        cfg = ModelConfig(**{**TINY.to_dict(), **fields})
        with pytest.raises(E.ConfigMismatch, match=next(f for f in fields if f != "rope_scaling_type")):
            NanoqwenWriter(tmp_path / "m.nanoqwen", cfg, specs_for(TINY), [])
    assert os.listdir(tmp_path) == []


def test_writer_writes_one_file(tmp_path):
    """A second `with` on a writer (after a commit, or nested inside the first) is WriterUsageError: it would
    commit the first run's counts over the target with only a placeholder behind them."""
    path = tmp_path / "m.nanoqwen"
    rng = np.random.default_rng(4)
    specs = specs_for(TINY)
    w = NanoqwenWriter(path, TINY, specs, [])
    with w:
        for s in specs:
            w.write_tensor(s.name, random_payload(s, rng))
    good = path.read_bytes()
    with pytest.raises(E.WriterUsageError, match="fresh writer"):
        with w:
            pass
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["m.nanoqwen"]
    nested = NanoqwenWriter(tmp_path / "n.nanoqwen", TINY, specs, [])
    with pytest.raises(E.WriterUsageError, match="fresh writer"):
        with nested:
            with nested:
                pass
    assert sorted(os.listdir(tmp_path)) == ["m.nanoqwen"]


def test_writer_takes_a_target_name_of_255_bytes(tmp_path):
    """The temp file's name adds ~20 bytes to the target's: a valid long target name still writes (temp_path cuts
    its copy of the name), and the temp name stays one TEMP_NAME matches."""
    from nanoqwen_format.writer import TEMP_NAME, temp_path
    name = "m" * 246 + ".nanoqwen"
    assert len(name) == 255
    tmp = os.path.basename(temp_path(tmp_path / name))
    assert len(os.fsencode(tmp)) <= 255 and TEMP_NAME.match(tmp)
    make_random_file(tmp_path / name, seed=3)
    assert os.listdir(tmp_path) == [name]
    with open_file(tmp_path / name) as f:
        assert len(f.tensors) > 0
