"""The package's version: the wheel's metadata reads it from here, and it must equal the C library's
gg_version() (CMakeLists.txt's project VERSION); _lib checks that at import."""
__version__ = "0.2.0"
