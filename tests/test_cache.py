"""The cubin cache, the compile notice, warm-up selection and a cheap import.

The cache's file layer (:mod:`baracuda_numba.cubin_cache`) is host code: these tests drive
it with fake payloads on the CPU (no compile). The GPU tests at the end compile one small
kernel for real.
"""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
from conftest import SIMULATOR

from baracuda_numba import cubin_cache
from baracuda_numba.launch import compile_notice

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _child_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python: this checkout first on its path, then whatever
    the parent's path held (site folders a GPU machine adds, say)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)

KEY = dict(source_digest="abc", name="scan_rows[BF16]", signature="(array(uint16, 1d, A),)",
           max_registers=None, cc=(9, 0), package_version="0.1.0",
           numba_cuda_version="0.30.4", driver_version=12080)


@pytest.fixture
def fresh_warnings():
    """Forget which cache warnings this process already gave (each test sees its first)."""
    cubin_cache.reset_warnings()
    yield
    cubin_cache.reset_warnings()


def _counting_build(calls: list[str], name: bytes = b"kernel", payload: bytes = b"\x7fELF"):
    def build():
        calls.append("built")
        return name, payload
    return build


@pytest.mark.parametrize("field, value", [
    ("source_digest", "abd"), ("package_version", "0.1.1"), ("cc", (8, 0)),
    ("numba_cuda_version", "0.30.5"), ("driver_version", 12090), ("name", "scan_rows[F16]"),
    ("signature", "(array(float16, 1d, A),)"), ("max_registers", 64)])
def test_key_changes_with_each_part(field, value):
    key = cubin_cache.entry_key(**KEY)
    assert cubin_cache.entry_key(**KEY) == key  # deterministic
    assert cubin_cache.entry_key(**dict(KEY, **{field: value})) != key


def test_source_digest_follows_the_kernel_source(tmp_path, monkeypatch):
    """The digest that goes into the key changes when the kernel module's file does."""
    from baracuda_numba.launch import source_digest

    # a module name of its own per run: an imported module keeps the file it came from
    name = "fake_kernels_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)
    module = tmp_path / f"{name}.py"
    module.write_text("def body():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = source_digest(name)
    assert before != source_digest("baracuda_numba.kernels.scan")
    module.write_text("def body():\n    return 2\n")
    source_digest.cache_clear()
    assert source_digest(name) != before
    source_digest.cache_clear()


def test_source_digest_follows_imported_kernel_modules():
    """Device code a family takes from another family's module (softmax uses rope's 16-byte
    unit codecs) is part of its digest, transitively, so a change there cannot leave a
    stale cubin."""
    import pathlib

    from baracuda_numba import kernels
    from baracuda_numba.launch import imported_kernel_sources

    root = pathlib.Path(kernels.__path__[0])
    found = imported_kernel_sources({root / "softmax.py"}, root)
    assert root / "rope" / "units.py" in found and root / "softmax.py" not in found
    assert imported_kernel_sources({root / "write_slice.py"}, root) == {root / "common.py"}


def test_source_digest_covers_a_family_subpackage(tmp_path):
    """A family split into a subpackage (``kernels/reduce/``) hashes every file of it for
    each of its modules, and the imports of its files resolve from where they stand
    (``from ..common``, ``from .ops``, another family's subpackage)."""
    import pathlib

    from baracuda_numba import kernels
    from baracuda_numba.launch import imported_kernel_sources, source_digest

    root = pathlib.Path(kernels.__path__[0])
    modules = sorted(p.stem for p in (root / "reduce").glob("*.py") if p.stem != "__init__")
    assert len(modules) > 1
    digests = {source_digest(f"baracuda_numba.kernels.reduce.{m}") for m in modules}
    assert len(digests) == 1 and digests != {source_digest("baracuda_numba.kernels.scan")}
    found = imported_kernel_sources({root / "reduce" / "backward_rows.py"}, root)
    assert {root / "common.py", root / "reduce" / "ops.py"} <= found

    fake = tmp_path / "kernels"
    (fake / "fam").mkdir(parents=True)
    (fake / "common.py").write_text("X = 1\n")
    (fake / "other.py").write_text("from .common import X\n")
    (fake / "fam" / "a.py").write_text("from ..other import X\nfrom .b import Y\n")
    (fake / "fam" / "b.py").write_text("Y = 2\n")
    (fake / "user.py").write_text("from .fam import a\nfrom .._runtime import Z\n")
    assert imported_kernel_sources({fake / "fam" / "a.py"}, fake) == {
        fake / "other.py", fake / "common.py", fake / "fam" / "b.py"}
    assert imported_kernel_sources({fake / "user.py"}, fake) == {
        fake / "fam" / "a.py", fake / "fam" / "b.py", fake / "other.py", fake / "common.py"}


def test_imported_kernel_sources_follow_subpackages(tmp_path):
    """A family split into a subpackage is imported whole (``from .fam import`` pulls in
    every file of ``kernels/fam/``), and its modules' ``from ..other import`` lines are
    followed; modules outside the kernels folder (``from ...launch``) are not kernel code."""
    from baracuda_numba.launch import imported_kernel_sources

    root = tmp_path / "kernels"
    (root / "fam").mkdir(parents=True)
    (root / "user.py").write_text("from .fam import THING\n")
    (root / "fam" / "__init__.py").write_text("from .one import THING\n")
    (root / "fam" / "one.py").write_text("from ..other import X\nfrom ...launch import K\n")
    (root / "other.py").write_text("X = 1\n")
    (root / "unused.py").write_text("Y = 2\n")
    (tmp_path / "launch.py").write_text("K = 3\n")
    assert imported_kernel_sources({root / "user.py"}, root) == {
        root / "fam" / "__init__.py", root / "fam" / "one.py", root / "other.py"}


def test_source_digest_covers_a_split_family():
    """Every module of a family subpackage (``kernels/scan/``) has the family's digest, and
    its kernels map to the family (``precompile --only scan`` finds them all)."""
    from baracuda_numba.launch import kernel_family, registered_kernels, source_digest

    scan_modules = {k.py_func.__module__ for k in registered_kernels()
                    if k.py_func.__module__.startswith("baracuda_numba.kernels.scan.")}
    assert len(scan_modules) > 1
    assert len({source_digest(m) for m in scan_modules}) == 1
    assert source_digest("baracuda_numba.kernels.scan.fast") != source_digest(
        "baracuda_numba.kernels.write_slice")
    assert {kernel_family(k) for k in registered_kernels()
            if k.py_func.__module__ in scan_modules} == {"scan"}


def test_entry_round_trip_and_damage_is_detected():
    data = cubin_cache.encode(b"_Z6kernel", b"\x7fELF" + bytes(range(256)))
    assert cubin_cache.decode(data) == (b"_Z6kernel", b"\x7fELF" + bytes(range(256)))
    for damaged in (data[:-1], data[:len(cubin_cache.MAGIC) + 3], b"", data + b"x",
                    data[:-5] + b"xxxxx", b"kernel\0\x7fELF",  # the old layout
                    data.replace(b"_Z6kernel", b"_Z6kernfl")):
        assert cubin_cache.decode(damaged) is None


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "empty"])
def test_damaged_entry_is_rebuilt_never_loaded(tmp_path, damage):
    path = tmp_path / f"{cubin_cache.entry_key(**KEY)}.cubin"
    good = cubin_cache.encode(b"kernel", b"\x7fELF-old")
    path.write_bytes({"truncated": good[:-3], "empty": b"",
                      "corrupt": good[:-1] + b"!"}[damage])
    calls: list[str] = []
    entry, built = cubin_cache.lookup_or_fill(path, _counting_build(calls))
    assert (entry, built, calls) == ((b"kernel", b"\x7fELF"), True, ["built"])
    assert cubin_cache.read_entry(path) == (b"kernel", b"\x7fELF")  # replaced
    entry, built = cubin_cache.lookup_or_fill(path, _counting_build(calls))
    assert (entry, built, calls) == ((b"kernel", b"\x7fELF"), False, ["built"])


_FILLER = textwrap.dedent("""
    import os, pathlib, sys, time
    from baracuda_numba import cubin_cache

    root, log, go, keys = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    while not os.path.exists(go):  # start together
        time.sleep(0.001)

    def build(key):
        def run():
            time.sleep(0.05)  # a compile long enough for the others to arrive
            with open(log, "a") as handle:
                handle.write(f"{key} {os.getpid()}\\n")
            return b"entry", f"payload {key}".encode() * 1000
        return run

    for key in range(keys):
        entry, _ = cubin_cache.lookup_or_fill(root / f"{key}.cubin", build(key))
        assert entry == (b"entry", f"payload {key}".encode() * 1000), entry
""")


def test_concurrent_fillers_build_each_entry_once(tmp_path):
    """Processes started at once on one empty folder all succeed, leave one intact entry
    per key and no temporary files, and build each key once between them."""
    root, log, go = tmp_path / "cache", tmp_path / "builds.log", tmp_path / "go"
    root.mkdir()
    processes, keys = 6, 4
    env = _child_env()
    fillers = [subprocess.Popen([sys.executable, "-c", _FILLER, str(root), str(log),
                                 str(go), str(keys)], env=env, stderr=subprocess.PIPE,
                                text=True) for _ in range(processes)]
    time.sleep(0.5)
    go.touch()
    for filler in fillers:
        _, err = filler.communicate(timeout=120)
        assert filler.returncode == 0, err
    built = sorted(line.split()[0] for line in log.read_text().splitlines())
    assert built == [str(k) for k in range(keys)]
    entries = sorted(p.name for p in root.glob("*.cubin"))
    assert entries == [f"{k}.cubin" for k in range(keys)]
    for k in range(keys):
        assert cubin_cache.read_entry(root / f"{k}.cubin") == \
            (b"entry", f"payload {k}".encode() * 1000)
    assert not list(root.glob("*.tmp"))


def _unwritable_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder that exists and cannot be written (root ignores permission bits: then a
    /proc folder, which refuses new files to everyone)."""
    if os.geteuid() != 0:
        folder = tmp_path / "readonly"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    return pathlib.Path(f"/proc/{os.getpid()}")


def test_read_only_folder_compiles_in_memory_with_one_warning(tmp_path, fresh_warnings):
    folder = _unwritable_folder(tmp_path)
    calls: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for key in range(3):
            entry, built = cubin_cache.lookup_or_fill(folder / f"{key}.cubin",
                                                      _counting_build(calls))
            assert (entry, built) == ((b"kernel", b"\x7fELF"), True)
    assert calls == ["built"] * 3
    assert [w.category for w in caught] == [RuntimeWarning], [str(w.message) for w in caught]
    assert "in memory" in str(caught[0].message)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="permission bits (root writes anyway)")
def test_read_only_folder_still_serves_its_entries(tmp_path, fresh_warnings):
    folder = tmp_path / "image"
    folder.mkdir()
    assert cubin_cache.write_entry(folder / "k.cubin", b"kernel", b"\x7fELF")
    folder.chmod(0o555)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        entry, built = cubin_cache.lookup_or_fill(folder / "k.cubin", _counting_build([]))
    assert (entry, built) == ((b"kernel", b"\x7fELF"), False)


def test_cache_folder_that_cannot_be_made_warns_once(tmp_path, monkeypatch, fresh_warnings):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("BARACUDA_CACHE_DIR", str(blocker / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cubin_cache.cache_dir() is None
        assert cubin_cache.cache_dir() is None
    assert len(caught) == 1 and caught[0].category is RuntimeWarning


def test_cache_dir_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("BARACUDA_CACHE_DIR", str(tmp_path / "a" / "b"))
    assert cubin_cache.cache_dir() == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir()
    monkeypatch.delenv("BARACUDA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cubin_cache.cache_dir() == tmp_path / "xdg" / "baracuda_numba"


def test_slow_compile_logs_one_line(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="baracuda_numba")
    with compile_notice("scan_rows[BF16]", tmp_path / "k.cubin", after=0.0):
        time.sleep(0.2)
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and infos[0].name == "baracuda_numba"
    assert infos[0].getMessage() == \
        f"compiling scan_rows[BF16] (first use; cached in {tmp_path})"
    assert any("compiled scan_rows[BF16] in" in r.getMessage() for r in caplog.records
               if r.levelno == logging.DEBUG)


def test_fast_compile_logs_nothing_at_info(caplog):
    caplog.set_level(logging.INFO, logger="baracuda_numba")
    with compile_notice("scan_rows[BF16]", None, after=5.0):
        pass
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_compile_notice_can_be_silenced(caplog):
    logger = logging.getLogger("baracuda_numba")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with compile_notice("scan_rows[BF16]", None, after=0.0):
            time.sleep(0.2)
    finally:
        logger.setLevel(level)
    assert not [r for r in caplog.records if r.name == "baracuda_numba"]


def test_notice_shows_without_logging_configured():
    """No logging set up by the application: the line still reaches stderr (Python's own
    last resort shows warnings only)."""
    script = textwrap.dedent("""
        import time
        from baracuda_numba.launch import compile_notice
        with compile_notice("scan_rows[BF16]", None, after=0.0):
            time.sleep(0.2)
    """)
    env = _child_env(NUMBA_ENABLE_CUDASIM="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ("baracuda_numba: compiling scan_rows[BF16] (first use; "
                                   "not cached: no writable cache folder)")


def test_import_stays_cheap():
    """``import baracuda_numba`` (and its ``warmup`` attribute) loads neither Numba, torch
    nor CuPy."""
    script = textwrap.dedent("""
        import sys
        import baracuda_numba
        baracuda_numba.warmup
        heavy = sorted(m for m in ("numba", "torch", "cupy") if m in sys.modules)
        assert not heavy, heavy
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_child_env(), timeout=120)
    assert done.returncode == 0, done.stderr


def test_warmup_selects_families_and_dtypes():
    from baracuda_numba.launch import kernel_dtype, kernel_family
    from baracuda_numba.precompile import select_kernels

    every = select_kernels()
    scan_bf16 = select_kernels(["scan"], ["bf16"])
    assert scan_bf16 and len(scan_bf16) < len(every)
    assert {kernel_family(k) for k in scan_bf16} == {"scan"}
    assert {kernel_dtype(k) for k in scan_bf16} <= {"bf16", "half", "2b", None}
    slices = select_kernels(["write_slice"], ["f32"])
    assert slices and {kernel_dtype(k) for k in slices} <= {"4b", "f32", None}
    with pytest.raises(ValueError, match="not kernel families"):
        select_kernels(["cumsum_typo"])
    with pytest.raises(ValueError, match="dtypes entry"):
        select_kernels(None, ["float17"])


@pytest.mark.simulator
def test_warmup_is_a_no_op_in_the_simulator():
    import baracuda_numba

    assert SIMULATOR
    assert baracuda_numba.warmup(["write_slice"], ["f32"]) == 0


def test_kernel_family_of_modules_and_subpackages():
    from types import SimpleNamespace

    from baracuda_numba.launch import kernel_family

    def family(module):
        def body():
            pass
        body.__module__ = module
        return kernel_family(SimpleNamespace(py_func=body))

    assert family("baracuda_numba.kernels.scan") == "scan"
    assert family("baracuda_numba.kernels.reduce.forward") == "reduce"
    assert family("__main__") == "__main__"


def test_progress_counter_without_tqdm(capsys, monkeypatch):
    """Without tqdm the progress is a counter with the time left, on stderr."""
    from baracuda_numba import precompile

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    bar = precompile.Progress(3)
    for _ in range(3):
        bar.update()
    bar.close()
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("precompile: 3/3 kernels, ")
    assert "s left" in err


# -- GPU: a real compile through the cache ------------------------------------------------

_GPU_LOAD = textwrap.dedent("""
    import sys
    from numba import cuda, types
    from baracuda_numba.launch import Kernel, flat

    def add_one(x, n):
        i = cuda.grid(1)
        if i < n:
            x[i] += 1.0

    kernel = Kernel("cache_test_add_one", add_one, (flat(types.float32), types.int64),
                    register=False)
    kernel.load()
    assert kernel.loaded
    print("ok")
""")


@pytest.mark.gpu
def test_gpu_fillers_share_one_compile(tmp_path):
    """Four processes load one kernel on an empty cache folder at once: all succeed, one
    intact entry is left, and a fifth process finds it."""
    env = _child_env(BARACUDA_CACHE_DIR=str(tmp_path))
    script = tmp_path / "load.py"
    script.write_text(_GPU_LOAD)
    runs = [subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(4)]
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0 and out.strip() == "ok", err
    entries = list(tmp_path.glob("*.cubin"))
    assert len(entries) == 1 and cubin_cache.read_entry(entries[0]) is not None
    again = subprocess.run([sys.executable, str(script)], env=env, text=True,
                           capture_output=True, timeout=300)
    assert again.returncode == 0 and "compiling" not in again.stderr, again.stderr
