/* gpuguard/gpuguard.hpp — a header-only C++17 layer over the C API: gg::Error, gg::Guard,
 * gg::Arena, gg::Scope. */
#ifndef GPUGUARD_GPUGUARD_HPP
#define GPUGUARD_GPUGUARD_HPP

/* Said before anything else is parsed, so an older standard gets this line instead of template
 * errors from deep inside the header. MSVC keeps __cplusplus at 199711L unless /Zc:__cplusplus: ask
 * _MSVC_LANG. */
#if defined(_MSVC_LANG) && _MSVC_LANG > __cplusplus
#define GG__CPLUSPLUS _MSVC_LANG
#else
#define GG__CPLUSPLUS __cplusplus
#endif
#if GG__CPLUSPLUS < 201703L
#error "gpuguard.hpp needs C++17 or newer (-std=c++17); from C or older C++, include \
gpuguard/gpuguard.h"
#else

#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

/* Some C API functions share their name with a struct tag (gg_arena_stats): fine in C, but g++
 * -Wshadow says the function "hides the constructor". Keep that out of users' builds. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
#include "gpuguard/gpuguard.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/** @defgroup gg_cxx C++ layer
 *  Move-only RAII owners of guards, arenas and scopes, for C++17 programs and CUDA extensions (the
 *  header compiles with g++, clang++ and nvcc). Failures throw gg::Error carrying the library's
 *  code and detail message. Destructors never throw: they release what they own and ignore errors.
 *  @{ */

/** The gpuguard C++ layer. */
namespace gg {

/** A failed gpuguard call: the GG_E* code and the library's detail message. */
class Error : public std::runtime_error {
public:
  /** @param code a negative GG_E* code. @param what the message. */
  Error(int code, const std::string &what) : std::runtime_error(what), code_(code) {}
  /** The GG_E* code. */
  int code() const noexcept { return code_; }
  /** The code's symbolic name, e.g. "GG_ENOMEM". */
  const char *name() const noexcept { return gg_err_name(code_); }

private:
  int code_;
};

/** Throws gg::Error for a negative status, returns @p rc otherwise. The message is "NAME: detail":
 *  gg_last_error() as it is when it starts with the code's name already (the library writes it so),
 *  else with the name put in front; gg_strerror() when there is no detail. */
inline int check(int rc) {
  if (rc < 0) {
    const std::string name = gg_err_name(rc);
    const char *detail = gg_last_error();
    if (!detail || !*detail) throw Error(rc, name + ": " + gg_strerror(rc));
    const std::string text = detail, prefix = name + ": ";
    throw Error(rc, text.compare(0, prefix.size(), prefix) == 0 ? text : prefix + text);
  }
  return rc;
}

/** Owns a gg_guard_t: gg_guard_destroy() runs when it goes out of scope, including during
 *  unwinding. */
class Guard {
public:
  /** gg_guard_options_t filled with the defaults. */
  struct Options : gg_guard_options_t {
    Options() : gg_guard_options_t() { gg_guard_options_init(this); }
  };

  /** A guard with the default options. @throws gg::Error */
  Guard() : Guard(Options()) {}
  /** A guard with @p opts. @throws gg::Error */
  explicit Guard(const gg_guard_options_t &opts) { check(gg_guard_create(&g_, &opts)); }
  /** Runs the teardown (errors ignored). */
  ~Guard() { reset(); }
  /** Takes over @p o's guard. */
  Guard(Guard &&o) noexcept : g_(std::exchange(o.g_, nullptr)), owned_(std::move(o.owned_)) {}
  /** Tears down this guard, then takes over @p o's. */
  Guard &operator=(Guard &&o) noexcept {
    if (this != &o) {
      reset();
      g_ = std::exchange(o.g_, nullptr);
      owned_ = std::move(o.owned_);
    }
    return *this;
  }
  Guard(const Guard &) = delete;
  Guard &operator=(const Guard &) = delete;

  /** The C handle (still owned by this object). */
  gg_guard_t *get() const noexcept { return g_; }

  /** Registers a C cleanup. @return its registration id. @throws gg::Error */
  unsigned long long on_teardown(gg_cleanup_fn fn, void *user, const char *name = nullptr) {
    unsigned long long id = 0;
    check(gg_guard_on_teardown_ex(g_, fn, user, name, &id));
    return id;
  }

  /** Registers any callable taking no arguments (copied or moved into the registration). Exceptions
   *  it throws at teardown are swallowed, as they would be from a destructor.
   *  @return its registration id. @throws gg::Error */
  template <class F, class = std::enable_if_t<std::is_invocable_v<std::decay_t<F> &>>>
  unsigned long long on_teardown(F &&f, const char *name = nullptr) {
    auto fn = std::make_unique<std::function<void()>>(std::forward<F>(f));
    unsigned long long id = 0;
    check(gg_guard_on_teardown_ex(g_, &Guard::trampoline, fn.get(), name, &id));
    owned_.emplace_back(id, fn.release()); /* the trampoline deletes it when it runs */
    return id;
  }

  /** Cancels a registration. @throws gg::Error (GG_ENOTFOUND when it is not registered) */
  void cancel(unsigned long long id) {
    check(gg_guard_cancel(g_, id));
    for (auto &o : owned_) {
      if (o.first == id) {
        delete o.second;
        o = owned_.back();
        owned_.pop_back();
        break;
      }
    }
  }

  /** Runs the teardown now and reports its errors. @throws gg::Error */
  void destroy() {
    gg_guard_t *g = std::exchange(g_, nullptr);
    owned_.clear();
    check(gg_guard_destroy(g));
  }

  /** Runs the teardown now, ignoring errors; the object becomes empty. */
  void reset() noexcept {
    if (g_) gg_guard_destroy(std::exchange(g_, nullptr));
    owned_.clear();
  }

private:
  static void trampoline(void *p) noexcept {
    std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()> *>(p));
    try {
      (*fn)();
    } catch (...) {
      /* A cleanup must not throw across the C library; nothing sensible can be done with it
       * here. */
    }
  }

  gg_guard_t *g_ = nullptr;
  /* Callables registered and not yet run or cancelled; only their ids are looked at after
   * teardown. */
  std::vector<std::pair<unsigned long long, std::function<void()> *>> owned_;
};

class Scope;

/** Owns a gg_arena_t: gg_arena_destroy() runs when it goes out of scope. */
class Arena {
public:
  /** gg_arena_options_t filled with the defaults. */
  struct Options : gg_arena_options_t {
    Options() : gg_arena_options_t() { gg_arena_options_init(this); }
  };

  /** An arena with the default options. @throws gg::Error */
  Arena() : Arena(Options()) {}
  /** An arena with @p opts. @throws gg::Error */
  explicit Arena(const gg_arena_options_t &opts) { check(gg_arena_create(&a_, &opts)); }
  /** Destroys the arena (errors ignored). */
  ~Arena() { reset(); }
  /** Takes over @p o's arena. */
  Arena(Arena &&o) noexcept : a_(std::exchange(o.a_, nullptr)) {}
  /** Destroys this arena, then takes over @p o's. */
  Arena &operator=(Arena &&o) noexcept {
    if (this != &o) {
      reset();
      a_ = std::exchange(o.a_, nullptr);
    }
    return *this;
  }
  Arena(const Arena &) = delete;
  Arena &operator=(const Arena &) = delete;

  /** The C handle (still owned by this object). */
  gg_arena_t *get() const noexcept { return a_; }
  /** Gives up ownership: the caller destroys the returned handle. */
  gg_arena_t *release() noexcept { return std::exchange(a_, nullptr); }
  /** Destroys the arena now, ignoring errors; the object becomes empty. */
  void reset() noexcept {
    if (a_) gg_arena_destroy(std::exchange(a_, nullptr));
  }

  /** Allocates @p size bytes (device memory). @throws gg::Error (GG_ENOMEM, ...) */
  void *alloc(std::size_t size, const char *tag = nullptr, std::size_t align = 0) {
    void *p = nullptr;
    check(gg_alloc_ex(a_, size, align, tag, &p));
    return p;
  }
  /** Allocates room for @p n objects of type T. @throws gg::Error */
  template <class T> T *alloc_n(std::size_t n, const char *tag = nullptr) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T))
      throw Error(GG_EINVAL, "GG_EINVAL: gg::Arena::alloc_n: n * sizeof(T) overflows");
    return static_cast<T *>(alloc(n * sizeof(T), tag, alignof(T) > 256 ? alignof(T) : 0));
  }
  /** Releases one block. @throws gg::Error */
  void free(void *p) { check(gg_free(a_, p)); }
  /** Gives free chunks back to the driver beyond @p keep_bytes. @throws gg::Error */
  void trim(std::size_t keep_bytes = 0) { check(gg_arena_trim(a_, keep_bytes)); }
  /** The arena's statistics. @throws gg::Error */
  gg_arena_stats_t stats() const {
    gg_arena_stats_t s;
    check(gg_arena_stats(a_, &s));
    return s;
  }
  /** The arena's name. */
  const char *name() const noexcept { return gg_arena_name(a_); }
  /** "cuda" or "host". */
  const char *backend() const noexcept { return gg_arena_backend(a_); }
  /** Opens a scope of this arena. @throws gg::Error */
  inline Scope scope();

private:
  gg_arena_t *a_ = nullptr;
};

/** Owns an open scope: gg_scope_end() runs when it goes out of scope, including during
 *  unwinding. */
class Scope {
public:
  /** Opens a scope of @p arena. @throws gg::Error */
  explicit Scope(gg_arena_t *arena) {
    check(gg_scope_begin(arena, &s_));
    open_ = true;
  }
  /** Opens a scope of @p arena. @throws gg::Error */
  explicit Scope(Arena &arena) : Scope(arena.get()) {}
  /** Ends the scope if still open (errors ignored). */
  ~Scope() {
    if (open_) gg_scope_end(&s_);
  }
  /** Takes over @p o's open scope. */
  Scope(Scope &&o) noexcept : s_(o.s_), open_(std::exchange(o.open_, false)) {}
  Scope &operator=(Scope &&) = delete; /* scopes end in LIFO order: re-seating one would break it */
  Scope(const Scope &) = delete;
  Scope &operator=(const Scope &) = delete;

  /** Ends the scope now and reports errors. @throws gg::Error */
  void end() {
    if (open_) {
      open_ = false;
      check(gg_scope_end(&s_));
    }
  }
  /** The C scope. */
  const gg_scope_t &get() const noexcept { return s_; }

private:
  gg_scope_t s_{};
  bool open_ = false;
};

inline Scope Arena::scope() { return Scope(*this); }

} // namespace gg

/** @} */
#endif /* C++17 */
#endif
