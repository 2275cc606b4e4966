"""Nothing is lost on convert: nanoqwen-convert refuses output paths it must not replace (the source, links,
directories, devices, FIFOs, existing files without --force, read-only files), cleans up its temp file on SIGTERM /
SIGHUP / SIGINT with exit 128 + signum, removes the temp files of converters that were killed outright, fails on a
full disk with one line; nanoqwen-convert and nanoqwen-verify answer bad input with one line on stderr."""
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from nanoqwen_format import NanoqwenWriter, open_file
from nanoqwen_format import writer as writer_mod
from nanoqwen_format.writer import TEMP_NAME, remove_stale_temp_files, stale_temp_files, temp_path
from nanoqwen_quant import convert as convert_mod
from nanoqwen_quant.convert import main as convert_main, unwind_on_signals
from nanoqwen_quant.verify import main as verify_main
from format_helpers import TINY, make_random_file, specs_for
from synth import make_checkpoint

ROOT = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0
SIGNAL_WAIT_S = 120          # a cold numba cache on a loaded 2-core machine compiles for tens of seconds
STEP_SLEEP_S = 0.25          # injected per tensor so a signal lands mid-conversion (a 2-layer model has ~30 tensors)

# A converter child whose every tensor takes STEP_SLEEP_S longer: the conversion is mid-way for seconds, so a test
# can wait for its temp file and then signal it. The production code path is unchanged apart from the sleep.
SLOW_CONVERT = f"""
import signal, sys, time
# start as from an interactive shell, whatever the test runner's own dispositions (nohup, a background job)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from nanoqwen_quant import convert
real = convert._convert_tensor
def slow(*a, **k):
    time.sleep({STEP_SLEEP_S})
    return real(*a, **k)
convert._convert_tensor = slow
convert.main(sys.argv[1:])
"""


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                PYTHONWARNINGS="ignore")


def _run(args, timeout=120, cwd=None):
    """Run a command module as a real process: (exit code, stdout, stderr)."""
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=_env(),
                       cwd=cwd)
    return r.returncode, r.stdout, r.stderr


def _one_stderr_line(stderr):
    """The single line a failing command prints on stderr (and nothing else there)."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def _cli(cmd, args):
    r = CliRunner().invoke(cmd, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.stdout, r.stderr


def _tree(root):
    """Everything about a directory tree a write could change: names, kinds, sizes, modes, mtimes, contents, links."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            info = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_mtime_ns)
            if stat.S_ISLNK(st.st_mode):
                info += (os.readlink(p),)
            elif stat.S_ISREG(st.st_mode):
                info += (Path(p).read_bytes(),)
            out[os.path.relpath(p, root)] = info
    return out


def _temps(d):
    return sorted(n for n in os.listdir(d) if TEMP_NAME.match(n))


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A small checkpoint, shared (read-only) by the tests of this module."""
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "src", tokenizer=False, n_layers=2)


def _mount_tmpfs(path, *opts):
    """Mount a tmpfs at `path` (root only); False where this machine does not allow it."""
    path.mkdir(parents=True, exist_ok=True)
    if not IS_ROOT or shutil.which("mount") is None:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts), "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def _umount(path):
    subprocess.run(["umount", str(path)], capture_output=True)


@pytest.fixture
def readonly_dir(tmp_path):
    """A directory this process cannot create files in: a read-only tmpfs as root, mode 0555 otherwise."""
    d = tmp_path / "ro"
    if IS_ROOT:
        if not _mount_tmpfs(d, "ro", "size=64k"):
            pytest.skip("root cannot be refused a write without a read-only mount, and mount is not allowed here")
        yield d
        _umount(d)
    else:
        d.mkdir()
        d.chmod(0o555)
        yield d
        d.chmod(0o755)


# ------------------------------------------------------------------------------------------ output refusals
def _setup_refusal(case, tmp_path, src):
    """(source argument, output argument, extra args, needle) for one refusal case; builds what it needs."""
    work = tmp_path / "work"
    work.mkdir()
    existing = work / "old.nanoqwen"
    existing.write_bytes(b"previous contents")
    if case == "source_weights":            # the source's own model.safetensors, even with --force
        return src, src / "model.safetensors", ["--force"], "lies inside the source directory"
    if case == "source_dir":
        return src, src, ["--force"], "is the source"
    if case == "inside_source":
        return src, src / "m.nanoqwen", [], "lies inside the source directory"
    if case == "inside_source_via_link":
        (work / "link").symlink_to(src)
        return src, work / "link" / "m.nanoqwen", [], "lies inside the source directory"
    if case == "source_given_via_link":
        (work / "link").symlink_to(src)
        return work / "link", src / "m.nanoqwen", [], "lies inside the source directory"
    if case == "file_source":
        return src / "model.safetensors", src / "model.safetensors", ["--force"], "is the source"
    if case == "link_to_source_file":
        (work / "w.nanoqwen").symlink_to(src / "model.safetensors")
        return src, work / "w.nanoqwen", ["--force"], "(a link to "
    if case == "symlink":
        (work / "link.nanoqwen").symlink_to(existing)
        return src, work / "link.nanoqwen", ["--force"], "is a symbolic link"
    if case == "dangling_symlink":
        (work / "link.nanoqwen").symlink_to(work / "nowhere")
        return src, work / "link.nanoqwen", ["--force"], "is a symbolic link"
    if case == "directory":
        (work / "d.nanoqwen").mkdir()
        return src, work / "d.nanoqwen", ["--force"], "is a directory"
    if case == "fifo":
        os.mkfifo(work / "pipe.nanoqwen")
        return src, work / "pipe.nanoqwen", ["--force"], "is a FIFO, not a regular file"
    if case == "device_node":               # a node like /dev/full, made here so no real device is at risk
        try:
            os.mknod(work / "full", 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        except (PermissionError, OSError):
            pytest.skip("creating a device node needs root")
        return src, work / "full", ["--force"], "is a character device, not a regular file"
    if case == "existing_without_force":
        return src, existing, [], "already exists; pass --force"
    if case == "read_only_with_force":
        existing.chmod(0o444)
        return src, existing, ["--force"], "is read-only (mode 0444)"
    if case == "missing_dir":
        return src, work / "nodir" / "m.nanoqwen", [], "does not exist"
    raise AssertionError(case)


REFUSALS = ["source_weights", "source_dir", "inside_source", "inside_source_via_link", "source_given_via_link",
            "file_source", "link_to_source_file", "symlink", "dangling_symlink", "directory", "fifo", "device_node",
            "existing_without_force", "read_only_with_force", "missing_dir"]


@pytest.mark.parametrize("case", REFUSALS)
def test_output_refused_with_one_line_and_nothing_touched(tmp_path, src, case):
    s, out, extra, needle = _setup_refusal(case, tmp_path, src)
    before_work, before_src = _tree(tmp_path), _tree(src)
    code, stdout, stderr = _cli(convert_main, [s, "-o", out, "-q", *extra])
    assert code == 2, stderr
    line = _one_stderr_line(stderr)
    assert line.startswith("nanoqwen-convert: error: output ") and needle in line, line
    assert _tree(tmp_path) == before_work and _tree(src) == before_src


def test_output_refused_when_directory_not_writable(src, readonly_dir):
    code, _, stderr = _cli(convert_main, [src, "-o", readonly_dir / "m.nanoqwen", "-q"])
    assert code == 2
    assert "is not writable" in _one_stderr_line(stderr)
    assert os.listdir(readonly_dir) == []


def test_force_replaces_a_writable_file(tmp_path, src):
    out = tmp_path / "m.nanoqwen"
    out.write_bytes(b"previous contents")
    code, _, stderr = _cli(convert_main, [src, "-o", out, "-q", "--force"])
    assert code == 0, stderr
    with open_file(out) as f:
        assert f.config.n_layers == 2
    assert os.listdir(tmp_path) == ["m.nanoqwen"]


def test_hub_snapshot_is_a_source_too(tmp_path, src, monkeypatch):
    """A hub repo's snapshot files are links into the cache's blobs: writing over a blob or into the snapshot is
    refused, found after the snapshot is resolved."""
    import huggingface_hub
    snap = tmp_path / "hub" / "snapshots" / ("ab" * 20)
    blobs = tmp_path / "hub" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for p in src.iterdir():
        shutil.copy(p, blobs / p.name)
        (snap / p.name).symlink_to(blobs / p.name)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(snap))
    before = _tree(tmp_path)
    for out, extra, needle in [(blobs / "model.safetensors", ["--force"], "is the source"),
                               (snap / "m.nanoqwen", [], "lies inside the source directory")]:
        code, _, stderr = _cli(convert_main, ["Qwen/Fake-Tiny", "-o", out, "-q", *extra])
        assert code == 2 and needle in _one_stderr_line(stderr), stderr
    assert _tree(tmp_path) == before


# ------------------------------------------------------------------------------------------ signals
def _start_slow_convert(src, out, *extra):
    return subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, str(src), "-o", str(out), "-q", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())


def _wait_for_temp(proc, d):
    deadline = time.monotonic() + SIGNAL_WAIT_S
    while time.monotonic() < deadline:
        if _temps(d):
            return _temps(d)
        if proc.poll() is not None:
            raise AssertionError(f"converter ended before writing: {proc.returncode} {proc.communicate()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("no temp file appeared")


@pytest.mark.parametrize("sig, says", [(signal.SIGTERM, "terminated by SIGTERM"),
                                       (signal.SIGHUP, "terminated by SIGHUP"),
                                       (signal.SIGINT, "interrupted")])
def test_signal_mid_convert_removes_temp_file(tmp_path, src, sig, says):
    out = tmp_path / "m.nanoqwen"
    proc = _start_slow_convert(src, out)
    _wait_for_temp(proc, tmp_path)
    time.sleep(2 * STEP_SLEEP_S)                      # well inside the tensor loop
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=SIGNAL_WAIT_S)
    assert proc.returncode == 128 + sig, (proc.returncode, stderr)
    line = _one_stderr_line(stderr)
    assert line.startswith("nanoqwen-convert: error: ") and says in line and "no output written" in line
    assert os.listdir(tmp_path) == []


def test_signal_right_after_the_rename_says_the_file_is_written(tmp_path, src, monkeypatch):
    """The rename is the commit: a signal that lands after it must not claim that nothing was written."""
    real_replace = os.replace

    def replace_then_signal(a, b):
        real_replace(a, b)
        raise KeyboardInterrupt

    monkeypatch.setattr(writer_mod.os, "replace", replace_then_signal)
    out = tmp_path / "m.nanoqwen"
    code, _, stderr = _cli(convert_main, [src, "-o", out, "-q"])
    assert code == 130
    assert f"interrupted; {out} was written completely before it" in _one_stderr_line(stderr)
    monkeypatch.undo()
    with open_file(out) as f:                        # complete: every checksum verifies
        assert f.config.n_layers == 2
    assert os.listdir(tmp_path) == ["m.nanoqwen"]


def test_ignored_signal_stays_ignored():
    """nohup sets SIGHUP to SIG_IGN: the converter must not start dying on hang-up."""
    old_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with unwind_on_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL          # restored on the way out
    finally:
        signal.signal(signal.SIGHUP, old_hup)
        signal.signal(signal.SIGTERM, old_term)


# ------------------------------------------------------------------------------------------ stale temp files
def test_temp_of_killed_converter_removed_on_next_run(tmp_path, src):
    out = tmp_path / "m.nanoqwen"
    proc = _start_slow_convert(src, out)
    (temp,) = _wait_for_temp(proc, tmp_path)
    proc.kill()                                        # SIGKILL: no handler runs, the temp file stays
    proc.communicate(timeout=SIGNAL_WAIT_S)
    assert _temps(tmp_path) == [temp]
    code, _, stderr = _cli(convert_main, [src, "-o", out, "-q"])
    assert code == 0, stderr
    line = _one_stderr_line(stderr)
    assert line.startswith("nanoqwen-convert: removed 1 temp file(s) left by converters that no longer run: ")
    assert temp in line
    assert os.listdir(tmp_path) == ["m.nanoqwen"]


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_only_dead_owned_temp_files_of_ours_are_removed(tmp_path):
    out = tmp_path / "m.nanoqwen"
    dead = _dead_pid()
    stale = Path(temp_path(out, dead))
    stale.write_bytes(b"NANOQWEN" + bytes(200))
    stale_other_name = Path(temp_path(tmp_path / "other.nanoqwen", dead))
    stale_other_name.write_bytes(b"")                     # killed before its first write reached the disk
    live = Path(temp_path(out, os.getpid()))              # a converter still running: never touched
    live.write_bytes(b"NANOQWEN" + bytes(200))
    foreign = Path(temp_path(tmp_path / "notes.txt", dead))   # our pattern, someone else's content
    foreign.write_bytes(b"some other program's data")
    a_dir = Path(temp_path(out, dead))
    a_dir.mkdir()
    unrelated = tmp_path / "m.nanoqwen.tmp"
    unrelated.write_bytes(b"NANOQWEN")
    keep = {live.name, foreign.name, a_dir.name, unrelated.name}
    if IS_ROOT:
        others = Path(temp_path(out, dead))
        others.write_bytes(b"NANOQWEN")
        os.chown(others, 65534, 65534)                   # another user's file
        keep.add(others.name)
    assert sorted(stale_temp_files(tmp_path)) == sorted([str(stale), str(stale_other_name)])
    removed = remove_stale_temp_files(tmp_path)
    assert sorted(removed) == sorted([(str(stale), 208), (str(stale_other_name), 0)])
    assert set(os.listdir(tmp_path)) == keep


def test_writer_temp_file_name_and_content_match_the_pattern(tmp_path, monkeypatch):
    """What the writer creates is what stale_temp_files recognises (one pattern, one place)."""
    seen = []
    real = NanoqwenWriter._write_bytes

    def spy(self, arr, crc):
        if not seen:
            self._fh.flush()
            seen.append((os.path.basename(self._tmp), Path(self._tmp).read_bytes()[:8]))
        return real(self, arr, crc)

    monkeypatch.setattr(NanoqwenWriter, "_write_bytes", spy)
    make_random_file(tmp_path / "m.nanoqwen")
    name, head = seen[0]
    m = TEMP_NAME.match(name)
    assert m and m["name"] == "m.nanoqwen" and int(m["pid"]) == os.getpid() and head == b"NANOQWEN"
    assert os.listdir(tmp_path) == ["m.nanoqwen"]


# ------------------------------------------------------------------------------------------ full disk
def test_full_tmpfs_one_line_no_temp_left(tmp_path, src):
    full = tmp_path / "full"
    if not _mount_tmpfs(full, "size=256k"):
        pytest.skip("cannot mount a small tmpfs here (needs root); the monkeypatched ENOSPC tests cover this")
    try:
        code, _, stderr = _cli(convert_main, [src, "-o", full / "m.nanoqwen", "-q"])
        assert code == 2
        line = _one_stderr_line(stderr)
        assert "No space left on device" in line and "m.nanoqwen" in line
        assert os.listdir(full) == []
    finally:
        _umount(full)


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["tensor_write", "fsync"])
def test_enospc_one_line_no_temp_left(tmp_path, src, monkeypatch, where):
    if where == "tensor_write":
        monkeypatch.setattr(NanoqwenWriter, "_write_bytes", _enospc)
    else:                                               # network filesystems report a full disk at fsync / close
        monkeypatch.setattr(writer_mod.os, "fsync", _enospc)
    code, _, stderr = _cli(convert_main, [src, "-o", tmp_path / "m.nanoqwen", "-q"])
    assert code == 2
    assert "No space left on device" in _one_stderr_line(stderr)
    assert os.listdir(tmp_path) == []


def test_enospc_on_the_placeholder_write_removes_the_temp_file(tmp_path, monkeypatch):
    """The placeholder header is written in __enter__, before the `with` body: a failure there must clean up too."""
    real_fdopen = os.fdopen

    class FullFile:
        def __init__(self, fd, mode):
            self._f = real_fdopen(fd, mode)

        def write(self, data):
            _enospc()

        def close(self):
            self._f.close()

    monkeypatch.setattr(writer_mod.os, "fdopen", FullFile)
    with pytest.raises(OSError) as e:
        with NanoqwenWriter(tmp_path / "m.nanoqwen", TINY, specs_for(TINY), []):
            pass
    assert e.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []


def test_writer_will_not_replace_a_non_regular_file(tmp_path):
    """Defence at the point of harm: a FIFO that appears at the target while writing is not replaced."""
    from nanoqwen_format.errors import WriterUsageError
    target = tmp_path / "m.nanoqwen"
    real = NanoqwenWriter._commit

    def race(self):
        os.mkfifo(target)
        return real(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NanoqwenWriter, "_commit", race)
        with pytest.raises(WriterUsageError, match="found a FIFO"):
            make_random_file(target)
    assert stat.S_ISFIFO(os.lstat(target).st_mode) and os.listdir(tmp_path) == ["m.nanoqwen"]


# ------------------------------------------------------------------------------------------ bad input, both commands
@pytest.fixture(scope="module")
def good_file(tmp_path_factory, src):
    out = tmp_path_factory.mktemp("good") / "m.nanoqwen"
    convert_mod.convert_checkpoint(src, out)
    return out


def _bad_inputs(tmp_path, src, good_file):
    """(command module, args, code predicate, needle) rows: every one must end with one line on stderr."""
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    corrupt = tmp_path / "corrupt.nanoqwen"
    raw = bytearray(good_file.read_bytes())
    raw[-100] ^= 0xFF                                   # one flipped byte in the last item: a CRC mismatch
    corrupt.write_bytes(bytes(raw))
    truncated = tmp_path / "truncated.nanoqwen"
    truncated.write_bytes(good_file.read_bytes()[:1000])
    garbage = tmp_path / "garbage.nanoqwen"
    garbage.write_bytes(b"this is not a model\n" * 20)
    fifo = tmp_path / "fifo.nanoqwen"
    os.mkfifo(fifo)
    out = tmp_path / "out.nanoqwen"
    bad_index = tmp_path / "bad_index"                  # a weight_map value that is no file name
    bad_index.mkdir()
    shutil.copy(src / "config.json", bad_index / "config.json")
    (bad_index / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x.weight": 5}}))
    tok_dir = tmp_path / "tok_dir"                      # tokenizer.json is a directory
    shutil.copytree(src, tok_dir)
    (tok_dir / "tokenizer.json").unlink(missing_ok=True)
    (tok_dir / "tokenizer.json").mkdir()
    conv, ver = "nanoqwen_quant.convert", "nanoqwen_quant.verify"
    two = (lambda c: c == 2)
    nonzero = (lambda c: c != 0)
    return {
        "convert_missing_path": (conv, [tmp_path / "missing", "-o", out], two, "missing"),
        "convert_dir_not_a_checkpoint": (conv, [empty_dir, "-o", out], two, "config.json"),
        "convert_corrupt_nanoqwen_as_source": (conv, [corrupt, "-o", out], nonzero, "corrupt.nanoqwen"),
        "convert_no_output_option": (conv, [src], two, "'--output'"),
        "convert_bad_group_size": (conv, [src, "-o", out, "--group-size", "7"], two, "--group-size"),
        "convert_negative_threads": (conv, [src, "-o", out, "--threads", "-3"], two, "--threads"),
        "convert_zero_threads": (conv, [src, "-o", out, "--threads", "0"], two, "--threads"),
        "convert_threads_not_a_number": (conv, [src, "-o", out, "--threads", "many"], two, "--threads"),
        "convert_bad_quant": (conv, [src, "-o", out, "--quant", "int8"], two, "--quant"),
        "convert_bad_mode": (conv, [src, "-o", out, "--mode", "fast"], two, "--mode"),
        "convert_bad_lm_head": (conv, [src, "-o", out, "--lm-head", "bf16"], two, "--lm-head"),
        "convert_unknown_option": (conv, [src, "-o", out, "--bogus"], two, "--bogus"),
        "convert_revision_for_local_dir": (conv, [src, "-o", out, "--revision", "v1"], two, "--revision"),
        "convert_output_dir_missing": (conv, [src, "-o", tmp_path / "nodir" / "m.nanoqwen"], two, "does not exist"),
        "convert_index_value_not_a_name": (conv, [bad_index, "-o", out], two, "weight_map"),
        "convert_tokenizer_json_is_a_directory": (conv, [tok_dir, "-o", out], two, "tokenizer.json"),
        "verify_missing_path": (ver, [tmp_path / "missing.nanoqwen"], two, "no such file"),
        "verify_directory": (ver, [empty_dir], two, "is a directory"),
        "verify_fifo": (ver, [fifo], two, "is a FIFO"),
        "verify_crc_mismatch": (ver, [corrupt], (lambda c: c == 1), "invalid file"),
        "verify_truncated": (ver, [truncated], (lambda c: c == 1), "invalid file"),
        "verify_garbage": (ver, [garbage], (lambda c: c == 1), "invalid file"),
        "verify_source_missing": (ver, [good_file, "--source", tmp_path / "missing"], two, "missing"),
        "verify_source_not_a_checkpoint": (ver, [good_file, "--source", empty_dir], two, "config.json"),
        "verify_unknown_option": (ver, [good_file, "--bogus"], two, "--bogus"),
        "verify_no_file": (ver, [], two, "FILE"),
        "verify_index_value_not_a_name": (ver, [good_file, "--source", bad_index], two, "weight_map"),
        # a .nanoqwen source holds no source weights: without --eval nothing would be compared (it printed OK)
        "verify_nanoqwen_source_without_eval": (ver, [good_file, "--source", good_file], two, "--eval"),
    }


BAD_INPUT_CASES = ["convert_missing_path", "convert_dir_not_a_checkpoint", "convert_corrupt_nanoqwen_as_source",
                   "convert_no_output_option", "convert_bad_group_size", "convert_negative_threads",
                   "convert_zero_threads", "convert_threads_not_a_number", "convert_bad_quant", "convert_bad_mode",
                   "convert_bad_lm_head", "convert_unknown_option", "convert_revision_for_local_dir",
                   "convert_output_dir_missing", "verify_missing_path", "verify_directory", "verify_fifo",
                   "verify_crc_mismatch", "verify_truncated", "verify_garbage", "verify_source_missing",
                   "verify_source_not_a_checkpoint", "verify_unknown_option", "verify_no_file",
                   "convert_index_value_not_a_name", "convert_tokenizer_json_is_a_directory",
                   "verify_index_value_not_a_name", "verify_nanoqwen_source_without_eval"]


@pytest.mark.parametrize("case", BAD_INPUT_CASES)
def test_bad_input_one_line_on_stderr(tmp_path, src, good_file, case):
    module, args, code_ok, needle = _bad_inputs(tmp_path, src, good_file)[case]
    code, stdout, stderr = _run(["-m", module, *map(str, args)], timeout=60)
    assert code_ok(code), (code, stderr)
    line = _one_stderr_line(stderr)
    prog = "nanoqwen-convert" if module.endswith("convert") else "nanoqwen-verify"
    assert line.startswith(f"{prog}: error: ") or line.startswith(f"{prog}: invalid file: "), line
    assert needle in line, line
    assert "Traceback" not in stdout
    assert not (tmp_path / "out.nanoqwen").exists() and _temps(tmp_path) == []


def test_bad_input_unwritable_output_dir_one_line(src, readonly_dir):
    code, _, stderr = _run(["-m", "nanoqwen_quant.convert", str(src), "-o", str(readonly_dir / "m.nanoqwen")])
    assert code == 2
    assert "is not writable" in _one_stderr_line(stderr)


def test_unwinding_debris_stays_quiet(monkeypatch):
    """A finalizer that fails while a signal unwinds the converter (numba's llvmlite refs interrupted half-built) must
    not print a traceback beside the one-line error; before any signal such failures are reported as usual."""
    from nanoqwen_quant.convert import Terminated, unwind_on_signals
    seen = []
    hook = seen.append
    monkeypatch.setattr(sys, "unraisablehook", hook)

    class Debris:
        def __del__(self):
            raise AttributeError("half-built")

    with unwind_on_signals():
        Debris()
        assert len(seen) == 1                       # no signal yet: reported
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)                           # the handler raises Terminated here
        except Terminated:
            Debris()                                # the unwinding's debris: quiet
    assert len(seen) == 1 and sys.unraisablehook is hook


def test_unexpected_exception_is_one_line_internal_error(monkeypatch, tmp_path, src, good_file):
    """An exception no check foresaw (a bug, or an input nobody thought of) still ends in one line, exit 3, in
    both commands (one handler: OneLineErrorCommand's)."""
    from nanoqwen_quant import verify as verify_mod
    from nanoqwen_quant.one_line_errors import EXIT_INTERNAL

    def boom(*a, **k):
        raise RuntimeError("no check\nforesaw this")

    monkeypatch.setattr(verify_mod, "verify_file", boom)
    monkeypatch.setattr(convert_mod, "convert_checkpoint", boom)
    for prog, cmd, args in (("nanoqwen-verify", verify_main, [good_file]),
                            ("nanoqwen-convert", convert_main, [src, "-o", tmp_path / "m.nanoqwen"])):
        code, _, stderr = _cli(cmd, args)
        assert code == EXIT_INTERNAL
        assert _one_stderr_line(stderr) == f"{prog}: internal error: RuntimeError: no check foresaw this"


@pytest.mark.parametrize("command", ["convert", "verify"])
def test_ctrl_c_while_the_entry_point_imports(tmp_path, src, command):
    """The console scripts (pyproject.toml -> nanoqwen_quant.entry) import numpy and numba inside their Ctrl-C
    handler: a SIGINT during those imports is one line and exit 130, not an import traceback."""
    from process_helpers import as_from_a_terminal, wait_for_mapped
    from nanoqwen_quant.entry import EXIT_INTERRUPTED
    args = [str(src), "-o", str(tmp_path / "m.nanoqwen")] if command == "convert" else [str(tmp_path / "x")]
    for _attempt in range(3):
        p = subprocess.Popen([sys.executable, "-c", f"from nanoqwen_quant.entry import {command}; {command}()",
                              *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                             preexec_fn=as_from_a_terminal)
        assert wait_for_mapped(p.pid, "_multiarray_umath", SIGNAL_WAIT_S)   # numpy's extension: imports under way
        if p.poll() is not None:       # descheduled past the child's whole run: not the case under test
            p.communicate()
            continue
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=SIGNAL_WAIT_S)
        break
    else:
        raise AssertionError("the child finished three times before it could be signalled")
    # 130, or death by SIGINT itself after the handler's line (a shell shows 130 for both: see test_cli's
    # test_ctrl_c_during_start_up_has_no_traceback)
    assert p.returncode in (EXIT_INTERRUPTED, -signal.SIGINT), (p.returncode, err)
    assert "interrupted" in _one_stderr_line(err.decode("utf-8", "replace"))
    assert _temps(tmp_path) == [] and not (tmp_path / "m.nanoqwen").exists()


def test_console_scripts_start_through_the_entry_module():
    """pyproject.toml's scripts name nanoqwen_quant.entry (the Ctrl-C-safe importers), not the commands."""
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")   # (tomllib: Python >= 3.11)
    assert 'nanoqwen-convert = "nanoqwen_quant.entry:convert"' in text
    assert 'nanoqwen-verify = "nanoqwen_quant.entry:verify"' in text
