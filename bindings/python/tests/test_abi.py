"""The binding against the library it loads: the status table by name, and every ctypes struct's size
against the C sizeof (gg_sizeof), so a header change that the binding missed fails here, not at run time."""
import ctypes

from gpuguard import _lib, errors


def test_status_table_matches_the_library():
    assert errors.STATUS_CODES, "no GG_E* names in gpuguard.errors"
    for name, code in errors.STATUS_CODES.items():
        assert _lib.lib.gg_err_name(code).decode() == name, (name, code)
    # The library knows no code the binding lacks.
    unknown = _lib.lib.gg_err_name(-1000).decode()
    known = {code for code in range(-1, -100, -1) if _lib.lib.gg_err_name(code).decode() != unknown}
    assert known == set(errors.STATUS_CODES.values())
    assert errors.GG_OK == 0 and _lib.lib.gg_err_name(0).decode() == "GG_OK"
    assert set(errors.BY_CODE) == known  # one exception class per code


STRUCTS = {
    "gg_device_info_t": _lib.DeviceInfo,
    "gg_device_telemetry_t": _lib.DeviceTelemetry,
    "gg_process_t": _lib.Process,
    "gg_arena_options_t": _lib.ArenaOptions,
    "gg_arena_stats_t": _lib.ArenaStats,
    "gg_scope_t": _lib.Scope,
    "gg_block_info_t": _lib.BlockInfo,
    "gg_guard_options_t": _lib.GuardOptions,
    "gg_spawn_options_t": _lib.SpawnOptions,
    "gg_session_record_t": _lib.SessionRecord,
}


def test_every_ctypes_struct_has_the_c_size():
    for name, cls in STRUCTS.items():
        c_size = _lib.lib.gg_sizeof(name.encode())
        assert c_size > 0, f"the library does not know {name}"
        assert ctypes.sizeof(cls) == c_size, f"{cls.__name__}: ctypes {ctypes.sizeof(cls)} bytes, C {c_size}"


def test_every_ctypes_struct_is_checked():
    mine = {cls for cls in vars(_lib).values()
            if isinstance(cls, type) and issubclass(cls, ctypes.Structure) and cls is not ctypes.Structure}
    assert mine - set(STRUCTS.values()) == {_lib.StatsBuffer}  # Python-only: stats plus a reserve


def test_sizeof_refuses_unknown_names():
    assert _lib.lib.gg_sizeof(b"gg_no_such_t") == 0
    assert _lib.lib.gg_sizeof(None) == 0
