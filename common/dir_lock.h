// An exclusive lock on an output folder, so two commands never write one folder's files at once (two sweeps into
// one --output would each land results.csv from their own rows and lose the other's).
//   DirLock lock(dir, "sweep"): creates DIR/.shardsim.lock (O_NOFOLLOW) if needed and takes flock(LOCK_EX |
//   LOCK_NB) on it, then writes the holder ("pid 123 on host h, since 2026-12-02T08:00:00Z: sweep s.yaml") into it.
//   Held until the DirLock is destroyed or the process ends (the kernel drops flock locks of a dead process, so a
//   killed holder never leaves a stale lock). Another holder: UsageError (exit 2) naming the folder and the holder;
//   a holder of this host that is dying (gone, a zombie, exiting or with SIGKILL pending: killed a moment ago and
//   not yet through closing its files) is waited for, up to 10 s, so a resume right after `kill -9` finds the
//   folder free.
//   The lock file is left in place (removing it would race with the next locker).
#pragma once

#include <string>

namespace shardsim {

class DirLock {
 public:
  DirLock(const std::string& dir, const std::string& holder_text);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace shardsim
