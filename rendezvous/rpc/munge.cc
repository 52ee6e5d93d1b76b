#include "rendezvous/rpc/munge.h"

#include <dlfcn.h>
#include <munge.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

// The few libmunge functions ctrun calls, resolved once. The header gives
// their types; the library comes from dlopen, so that ctrun does not need
// libmunge2 installed unless it authenticates with munge.
struct Libmunge {
  decltype(&munge_ctx_create) ctx_create = nullptr;
  decltype(&munge_ctx_destroy) ctx_destroy = nullptr;
  decltype(&munge_ctx_set) ctx_set = nullptr;
  decltype(&munge_ctx_strerror) ctx_strerror = nullptr;
  decltype(&munge_encode) encode = nullptr;
  decltype(&munge_decode) decode = nullptr;
  std::string error;  // why it could not be loaded
};

const Libmunge& Load() {
  static const Libmunge* const lib = [] {
    auto* l = new Libmunge;
    void* so = dlopen("libmunge.so.2", RTLD_NOW | RTLD_LOCAL);
    if (so == nullptr) {
      l->error = absl::StrCat("cannot load libmunge.so.2 (Debian: libmunge2): ",
                              dlerror());
      return l;
    }
    auto bind = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
          dlsym(so, name));
      if (fn == nullptr && l->error.empty())
        l->error = absl::StrCat("libmunge.so.2 lacks ", name);
    };
    bind(l->ctx_create, "munge_ctx_create");
    bind(l->ctx_destroy, "munge_ctx_destroy");
    bind(l->ctx_set, "munge_ctx_set");
    bind(l->ctx_strerror, "munge_ctx_strerror");
    bind(l->encode, "munge_encode");
    bind(l->decode, "munge_decode");
    return l;
  }();
  return *lib;
}

using Context = std::unique_ptr<munge_ctx, void (*)(munge_ctx_t)>;

absl::StatusOr<Context> NewContext(const Libmunge& lib,
                                   const std::string& socket) {
  if (!lib.error.empty()) return absl::UnavailableError(lib.error);
  Context ctx(lib.ctx_create(), lib.ctx_destroy);
  if (ctx == nullptr) return absl::ResourceExhaustedError("munge_ctx_create");
  if (!socket.empty() && lib.ctx_set(ctx.get(), MUNGE_OPT_SOCKET,
                                     socket.c_str()) != EMUNGE_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "munge socket '", socket, "': ", lib.ctx_strerror(ctx.get())));
  }
  return ctx;
}

std::string Where(const std::string& socket) {
  return socket.empty() ? "munged" : absl::StrCat("munged at ", socket);
}

}  // namespace

absl::StatusOr<std::string> MungeEncode(const std::string& socket,
                                        absl::string_view payload) {
  const Libmunge& lib = Load();
  auto ctx = NewContext(lib, socket);
  if (!ctx.ok()) return ctx.status();
  char* credential = nullptr;
  if (lib.encode(&credential, ctx->get(), payload.data(),
                 static_cast<int>(payload.size())) != EMUNGE_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("no munge credential from ",
                                               Where(socket), ": ",
                                               lib.ctx_strerror(ctx->get())));
  }
  std::string out(credential);
  std::free(credential);
  return out;
}

absl::StatusOr<MungeIdentity> MungeDecode(const std::string& socket,
                                          const std::string& credential) {
  const Libmunge& lib = Load();
  auto ctx = NewContext(lib, socket);
  if (!ctx.ok()) return ctx.status();
  void* buf = nullptr;
  int len = 0;
  MungeIdentity id;
  const munge_err_t err =
      lib.decode(credential.c_str(), ctx->get(), &buf, &len, &id.uid, &id.gid);
  std::unique_ptr<void, void (*)(void*)> owned(buf, std::free);
  if (err == EMUNGE_SOCKET || err == EMUNGE_SNAFU || err == EMUNGE_NO_MEMORY) {
    return absl::UnavailableError(
        absl::StrCat("cannot check a munge credential with ", Where(socket),
                     ": ", lib.ctx_strerror(ctx->get())));
  }
  if (err != EMUNGE_SUCCESS) {
    return absl::UnauthenticatedError(absl::StrCat(
        "munge credential refused: ", lib.ctx_strerror(ctx->get())));
  }
  if (buf != nullptr) id.payload.assign(static_cast<const char*>(buf), len);
  return id;
}

std::string MungePayload(absl::string_view job_id) {
  if (job_id.empty()) return "ctrun status";
  return absl::StrCat("ctrun rendezvous ", job_id);
}

}  // namespace ctrun
