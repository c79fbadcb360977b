// Internal to checkpoint/: the two guards around every collective HDF5 step of a save or a read.
//   Watch: the last-resort watchdog (SHARDSIM_WATCHDOG_S, default 300 s, 0 = never). A step that has not returned
//          in time prints one line naming the file, the step, the chip and the I/O error this rank saw, and aborts
//          the job with exit code 3.
//   agree: every rank runs F; if it throws on any rank, every rank throws the lowest failing rank's error (same
//          class: ConfigError for exit 2, RuntimeFault otherwise), so no rank enters a collective the others skip.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

namespace shardsim::checkpoint::detail {

struct Watch {
  explicit Watch(const std::string& what);
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
};

void agree(MPI_Comm comm, const std::function<void()>& f);

}  // namespace shardsim::checkpoint::detail
