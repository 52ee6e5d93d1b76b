// Keeps the statically linked executables' glibc floor at 2.34 (the wheel's
// promise, scripts/check-binaries.sh): two functions of newer glibc that the
// static C++ runtime would call, defined here so that the executable's own
// definition takes the call. Where glibc has them too, ours serve the
// program just as well.
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

// libstdc++'s std::random_device (which gRPC uses) calls arc4random (glibc
// 2.36) when the runtime was built on a glibc that has it: the same bytes
// from getrandom(2), else /dev/urandom. Like glibc's, it never returns
// bytes that are not random: with neither source it aborts.
extern "C" uint32_t arc4random(void) {
  uint32_t value = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(&value);
  size_t got = 0;
  while (got < sizeof value) {
    const long n = syscall(SYS_getrandom, bytes + got, sizeof value - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      break;  // no getrandom (Linux < 3.17)
    }
  }
  if (got < sizeof value) {
    const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && got < sizeof value) {
      const ssize_t n = read(fd, bytes + got, sizeof value - got);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (!(n < 0 && errno == EINTR)) {
        break;
      }
    }
    if (fd >= 0) close(fd);
  }
  if (got < sizeof value) abort();
  return value;
}

// libgcc's unwinder (linked statically: libgcc_s would be one more shared
// library) finds the exception tables of the object holding a return
// address with _dl_find_object (glibc 2.35), and fails the throw if it
// fails. This answers from dl_iterate_phdr, as the unwinder did before
// 2.35: the loaded object whose PT_LOAD segments hold `address`, and its
// PT_GNU_EH_FRAME segment.
extern "C" int _dl_find_object(void* address, dl_find_object* result) noexcept {
  struct Search {
    uintptr_t pc;
    dl_find_object* result;
    bool found = false;
  } search{reinterpret_cast<uintptr_t>(address), result};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* s = static_cast<Search*>(data);
        uintptr_t low = UINTPTR_MAX, high = 0, eh_frame = 0;
        bool holds = false;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          const uintptr_t start = info->dlpi_addr + segment.p_vaddr;
          if (segment.p_type == PT_LOAD) {
            const uintptr_t end = start + segment.p_memsz;
            low = std::min(low, start);
            high = std::max(high, end);
            holds = holds || (s->pc >= start && s->pc < end);
          } else if (segment.p_type == DLFO_EH_SEGMENT_TYPE) {
            eh_frame = start;
          }
        }
        if (!holds) return 0;
        *s->result = {};
        s->result->dlfo_map_start = reinterpret_cast<void*>(low);
        s->result->dlfo_map_end = reinterpret_cast<void*>(high);
        s->result->dlfo_eh_frame = reinterpret_cast<void*>(eh_frame);
        s->found = true;
        return 1;
      },
      &search);
  return search.found ? 0 : -1;
}
