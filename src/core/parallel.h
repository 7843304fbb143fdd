// An exception thrown inside an OpenMP loop's body cannot leave it (the runtime terminates the
// process); FirstError keeps the first one and rethrows it after the loop, so that an error in a
// parallel region reaches the caller as it would from a serial one.
//   FirstError errors;
//   #pragma omp parallel for
//   for (...) errors.run([&] { body; });
//   errors.rethrow();
#pragma once

#include <exception>
#include <mutex>

namespace flexcp {

class FirstError {
 public:
  template <class F>
  void run(F&& body) noexcept {
    try {
      body();
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
};

}  // namespace flexcp
