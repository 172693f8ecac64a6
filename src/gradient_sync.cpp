// GradientSync::current() and its Scope (gradient_sync.h).
#include "tandem/detail/gradient_sync.h"

namespace tandem {

namespace {
thread_local GradientSync* current_sync = nullptr;
}  // namespace

GradientSync* GradientSync::current() { return current_sync; }

GradientSync::Scope::Scope(GradientSync* sync) : previous_(current_sync) { current_sync = sync; }

GradientSync::Scope::~Scope() { current_sync = previous_; }

}  // namespace tandem
