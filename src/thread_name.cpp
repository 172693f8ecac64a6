// The thread-name registry: pthread_setname_np for the system, a map for the profile's summary
// (a thread's name can also be read from /proc, but only while it lives and only by its kernel
// id; the map answers for either id after the thread ended).
#include "tandem/detail/thread_name.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <unordered_map>

namespace tandem {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<uint64_t, std::string>& registry() {
  static std::unordered_map<uint64_t, std::string> names;
  return names;
}

}  // namespace

void name_this_thread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());  // longer names are refused
  const auto kernel_id = static_cast<uint64_t>(syscall(SYS_gettid));
  const auto pthread_id = static_cast<uint64_t>(pthread_self());
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[kernel_id] = name;
  registry()[pthread_id] = name;
  registry()[pthread_id & 0xffffffffu] = name;  // as a 32-bit trace id truncates it
}

std::string named_thread(uint64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto it = registry().find(id);
  return it == registry().end() ? std::string() : it->second;
}

}  // namespace tandem
