// Exceptions and OpenMP. An exception that leaves a parallel region calls
// std::terminate: one std::bad_alloc in one worker aborted the whole process
// (seqpack predict --stream, exit 134, every later line unanswered). So each
// region's body runs under OmpErrors::run, which keeps the first exception;
// after the region, rethrow() raises it in the calling thread, where the
// ordinary error handling sees it.
//
//   cpu::OmpErrors errors;
//   #pragma omp parallel
//   errors.run([&] { work(omp_get_thread_num()); });
//   errors.rethrow();
//
// A body that throws between barriers would leave its team waiting, so the
// bodies that meet at barriers (the recurrent core's time loops) allocate
// nothing: their workspaces are made before the region opens.
#pragma once

#include <exception>
#include <mutex>

namespace seqpack::cpu {

class OmpErrors {
 public:
  template <typename F>
  void run(F&& body) noexcept {
    try {
      body();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!first_) first_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::mutex mu_;
  std::exception_ptr first_;
};

}  // namespace seqpack::cpu
