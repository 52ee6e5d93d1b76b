// Keeps the statically linked executables' glibc floor at 2.34 (the wheel's
// promise, scripts/check-binaries.sh).
//
// libstdc++'s std::random_device (which gRPC uses) calls arc4random when
// the C++ runtime was built on a glibc that has it; linked statically into
// our executables, that call needs glibc 2.36. This definition, in the
// executable, takes the call instead: the same bytes from getrandom(2).
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

extern "C" uint32_t arc4random(void) {
  uint32_t value = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(&value);
  size_t got = 0;
  while (got < sizeof value) {
    const long n = syscall(SYS_getrandom, bytes + got, sizeof value - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      break;  // no getrandom (Linux < 3.17): random_device's other sources
    }
  }
  return value;
}
