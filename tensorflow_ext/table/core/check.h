// TFEXT_DCHECK(cond, message): a precondition or invariant of the table core,
// checked in debug-check builds and compiled out otherwise.
//
// Debug-check builds define TFEXT_DEBUG_CHECKS: the core's test target
// //tensorflow_ext/table/core:hash_table_debugchecks_test (run by
// `make test-cc` beside the optimized one), or any target built with
// `bazel build --config=debugchecks`. There a failed check prints the file,
// line, condition and message and aborts: a broken invariant of the index or
// the arena means memory is already being misused, and going on would only
// move the failure further from its cause. Without TFEXT_DEBUG_CHECKS the
// condition is not evaluated (it is still compiled, so it cannot rot), and
// nothing in the core aborts the process.
//
// Conditions must be free of side effects: they only run in debug builds.

#ifndef TENSORFLOW_EXT_TABLE_CORE_CHECK_H_
#define TENSORFLOW_EXT_TABLE_CORE_CHECK_H_

#include <cstdio>
#include <cstdlib>

namespace tfext {
namespace table {

#ifdef TFEXT_DEBUG_CHECKS
constexpr bool kDebugChecks = true;
#else
constexpr bool kDebugChecks = false;
#endif

namespace internal {

[[noreturn]] inline void DcheckFailed(const char* file, int line, const char* condition, const char* message) {
  std::fprintf(stderr, "%s:%d: tf_ext table: debug check failed: %s (%s)\n", file, line, condition, message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal
}  // namespace table
}  // namespace tfext

#ifdef TFEXT_DEBUG_CHECKS
#define TFEXT_DCHECK(cond, message)                                                            \
  do {                                                                                         \
    if (!(cond)) ::tfext::table::internal::DcheckFailed(__FILE__, __LINE__, #cond, (message)); \
  } while (0)
#else
// sizeof: type-checked, never evaluated.
#define TFEXT_DCHECK(cond, message) \
  do {                              \
    (void)sizeof(!(cond));          \
    (void)sizeof(message);          \
  } while (0)
#endif

#endif  // TENSORFLOW_EXT_TABLE_CORE_CHECK_H_
