// hpp_probe.cpp — a tiny C++ user of gpuguard.hpp, compiled (not run) by hpp_cxx17.sh under several
// -std= settings.
#include "gpuguard/gpuguard.hpp"

int main() {
  gg::Arena::Options opts;
  opts.backend = "host";
  return opts.capacity == 0 ? 0 : 1;
}
