"""The Python boundary and the files it opens by path, against hostile input: integers that would wrap
in ctypes, wrong types, a scope entered twice, a cleanup that never returns at interpreter exit,
intervals that would busy-loop, freed blocks in holders(), script in a timeline, a planted symlink or
FIFO as a leak report or beside `plot -o`, and a shim cache another user can write (as root with a
second user where one can be made)."""
import json
import os
import pwd
import subprocess
import sys
import textwrap
import time

import pytest

import gpuguard
from gpuguard import InvalidArgumentError, StateError
from gpuguard import _cachedir
from gpuguard.diagnostics import notebook, plot
from gpuguard.diagnostics.holding import buffer_keys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(os.path.dirname(os.path.abspath(gpuguard.__file__)))


def child(body, timeout=60, env=None):
    src = f"import sys\nsys.path[:0] = [{HERE!r}, {PKG!r}]\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


# ---- integers and types that cross into C (item 18) -------------------------------------------------

def test_adopt_of_a_wrapped_pid_is_refused_and_kills_nothing():
    p = subprocess.Popen(["sleep", "30"])
    try:
        for bad in (2 ** 32 + p.pid, -p.pid, 0, 2 ** 31):
            with pytest.raises(InvalidArgumentError, match="pid"):
                gpuguard.adopt(bad)
        gpuguard.teardown(grace_ms=0)
        assert p.poll() is None, "teardown ended a process that was never adopted"
        with pytest.raises(TypeError):
            gpuguard.adopt("1")
        with pytest.raises(InvalidArgumentError, match="start_time"):
            gpuguard.adopt(p.pid, start_time=2 ** 64)
    finally:
        p.kill()
        p.wait()


def test_arena_integers_are_range_checked():
    with pytest.raises(InvalidArgumentError, match="stream"):
        gpuguard.Arena(backend="host", stream=2 ** 64)
    with pytest.raises(InvalidArgumentError, match="stream"):
        gpuguard.Arena(backend="host", stream=-1)
    with gpuguard.Arena(capacity=64 << 20, backend="host") as a:
        b = a.alloc(4096)
        a.fill(b, 7, 16)
        for kw in ({"value": 2 ** 64 + 5}, {"value": 256}, {"value": -1}, {"n": 2 ** 64 + 16}, {"n": -1}):
            args = dict({"value": 7, "n": 16}, **kw)
            with pytest.raises(InvalidArgumentError):
                a.fill(b, args["value"], args["n"])
        assert a.read(b, 16) == bytes([7]) * 16  # nothing wrapped to 5 or to 16 bytes
        with pytest.raises(InvalidArgumentError, match="keep"):
            a.trim(-1)
        with pytest.raises(InvalidArgumentError, match="address"):
            a.free(2 ** 64 + b.ptr)
        with pytest.raises(InvalidArgumentError, match="n"):
            a.read(b, 2 ** 62)  # refused before a host buffer of that size is allocated
        for call in (lambda: a.alloc("16"), lambda: a.alloc(16, tag=5), lambda: a.trim(1.5),
                     lambda: a.fill(b, "x", 1), lambda: a.write(b, "text"), lambda: a.free(3.0),
                     lambda: gpuguard.Arena(backend=5), lambda: gpuguard.Guard(backend="host", device="0")):
            with pytest.raises(TypeError):
                call()
        b.free()


# ---- scopes (item 19) -------------------------------------------------------------------------------

def test_reentering_an_open_scope_is_refused_and_loses_nothing():
    with gpuguard.Arena(capacity=64 << 20, backend="host") as a:
        s = a.scope()
        with s:
            a.alloc(1 << 20)
            with pytest.raises(StateError):
                with s:
                    pass
            assert a.stats()["bytes_in_use"] >= 1 << 20
        assert a.stats()["bytes_in_use"] == 0  # the outer scope still ended and released its block
        assert a.stats()["scope_depth"] == 0
        with pytest.raises(StateError):  # a used scope object is not reused either
            with s:
                pass


# ---- interpreter exit (item 20) ---------------------------------------------------------------------

def test_a_cleanup_that_never_returns_at_exit_is_bounded():
    t0 = time.monotonic()
    r = child("""
        import time, gpuguard
        g = gpuguard.Guard(backend="host", teardown_timeout_ms=500)
        g.on_teardown(lambda: time.sleep(3600))
        print("ended", flush=True)
    """, timeout=30)
    took = time.monotonic() - t0
    assert "ended" in r.stdout
    assert r.returncode == 1 and "teardown_timeout_ms" in r.stderr, (r.returncode, r.stderr)
    assert took < 15, took


# ---- intervals (item 21) ----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), -0.0])
def test_intervals_that_would_busy_loop_are_refused(tmp_path, bad):
    with pytest.raises(ValueError):
        gpuguard.monitor(interval=bad, to=[])
    with pytest.raises(ValueError):
        gpuguard.record(str(tmp_path / "t.jsonl"), interval=bad)
    ext = notebook._Extension(shell=None)
    with pytest.raises(ValueError):
        ext.magic(f"watch {bad}")
    assert ext.watch_interval is None
    with pytest.raises(TypeError):
        gpuguard.monitor(interval="1", to=[])


# ---- holders and freed Allocations (item 22) ----------------------------------------------------------

def test_freed_allocations_are_not_listed():
    with gpuguard.Arena(capacity=64 << 20, backend="host") as a:
        dev = f"host:{a.device}"
        kept = a.alloc(1 << 20, tag="kept")
        gone = a.alloc(2 << 20, tag="gone")
        gone.free()
        with a.scope():
            inner = a.alloc(3 << 20, tag="scoped")
        keys = buffer_keys()
        assert keys.get((dev, kept.ptr)) == 1 << 20
        assert (dev, gone.ptr) not in keys and (dev, inner.ptr) not in keys, keys
        # The address reused: the live block shows, with its own size, not the freed one's.
        new = a.alloc(3 << 20, tag="new")
        if new.ptr == inner.ptr:
            assert buffer_keys()[(dev, new.ptr)] == 3 << 20
        a.free(new)
        assert (dev, new.ptr) not in buffer_keys()
        del inner, gone


# ---- plot (items 10 and 23) -------------------------------------------------------------------------

def _timeline(path, step='"<script>alert(1)</script>"'):
    recs = [{"type": "meta", "version": 1, "start": 0, "series": ["in_use"]},
            {"type": "sample", "t": 0.0, "step": 0, "in_use": 1},
            {"type": "sample", "t": 1.0, "step": 1, "in_use": 2}]
    lines = [json.dumps(r) for r in recs]
    lines.append('{"type": "mark", "kind": "oom", "t": "<script>x()</script>", "step": %s, "label": "l"}' % step)
    lines.append('{"type": "holders", "t": "<script>y()</script>", "step": %s, "in_use": 2, "total_bytes": 1, '
                 '"rows": []}' % step)
    lines.append('{"type": "sample", "t": "<script>z()</script>", "step": 2, "in_use": 3}')
    path.write_text("\n".join(lines) + "\n")


def test_plot_page_has_no_script_from_the_file(tmp_path):
    src, out = tmp_path / "t.jsonl", tmp_path / "m.html"
    _timeline(src)
    assert plot.main([str(src), "-o", str(out)]) == 0
    page = out.read_text()
    assert "<script" not in page.lower(), page[:2000]


def test_plot_does_not_write_through_a_planted_tmp(tmp_path):
    src, out = tmp_path / "t.jsonl", tmp_path / "m.html"
    _timeline(src, step="3")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, str(out) + ".tmp")
    assert plot.main([str(src), "-o", str(out)]) == 0
    assert victim.read_text() == "precious"
    assert out.is_file() and not out.is_symlink()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".m.html.")]


# ---- the leak report file (item 9) ------------------------------------------------------------------

def test_leak_report_to_a_fifo_or_symlink_is_refused(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "report.link"
    os.symlink(victim, link)
    for path in (fifo, link):
        r = child(f"""
            import gpuguard
            g = gpuguard.Guard(backend="host", leak_report={str(path)!r})
            a = gpuguard.Arena(backend="host", capacity=16 << 20)
            a.alloc(4096)
            g.close()
            print("closed", flush=True)
        """, timeout=20)
        assert "closed" in r.stdout, (path, r.stdout, r.stderr)
        assert "leak report" in r.stderr and ("regular" in r.stderr or "symbolic" in r.stderr), r.stderr
    assert victim.read_text() == "precious\n"


# ---- the PyTorch shim's cache (item 11) ---------------------------------------------------------------

def _second_user():
    if os.geteuid() != 0:
        return None
    name = "gg_hostile"
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    if subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                      capture_output=True).returncode != 0:
        return None
    return pwd.getpwnam(name)


def test_cache_dir_others_can_write_is_not_used(tmp_path, monkeypatch):
    # A cache others may write (a shared XDG_CACHE_HOME): never the one used.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    d = _cachedir.private_dir("gpuguard")
    assert not d.startswith(str(shared)), d
    st = os.stat(d)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0
    # Our own, private: used; a file in it someone else could write is not loaded.
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(own))
    d = _cachedir.private_dir("gpuguard")
    assert d == str(own / "gpuguard")
    so = own / "gpuguard" / "libx.so"
    so.write_bytes(b"\x7fELF")
    os.chmod(so, 0o600)
    assert _cachedir.usable(str(so))
    os.chmod(so, 0o666)
    assert not _cachedir.usable(str(so))
    os.chmod(so, 0o600)
    os.symlink(so, own / "gpuguard" / "link.so")
    assert not _cachedir.usable(str(own / "gpuguard" / "link.so"))
    # Unwritable: a private one instead, no PermissionError.
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/gg-none")
    d = _cachedir.private_dir("gpuguard")
    assert os.path.isdir(d) and os.access(d, os.W_OK)
    # The PyTorch backend's build cache uses it.
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        return  # gpuguard.torch imports only with PyTorch installed
    from gpuguard.torch import _native
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    assert not _native._cache_dir().startswith(str(shared))


def test_cache_owned_by_another_user_is_not_used(tmp_path, monkeypatch):
    user = _second_user()
    if user is None:
        pytest.skip("needs root and useradd for a second user")
    base = tmp_path / "theirs"
    (base / "gpuguard").mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    for p in (base, base / "gpuguard"):
        os.chown(p, user.pw_uid, user.pw_gid)
        os.chmod(p, 0o755)
    planted = base / "gpuguard" / "libgpuguard_torch-0123456789abcdef.so"
    planted.write_bytes(b"\x7fELF")
    os.chown(planted, user.pw_uid, user.pw_gid)
    monkeypatch.setenv("XDG_CACHE_HOME", str(base))
    d = _cachedir.private_dir("gpuguard")
    assert not d.startswith(str(base)), d
    assert not _cachedir.usable(str(planted))
    # A directory of ours whose parent the other user owns: they could swap it; not used either.
    os.chown(base / "gpuguard", 0, 0)
    os.chmod(base / "gpuguard", 0o700)
    assert not _cachedir.private_dir("gpuguard").startswith(str(base))
