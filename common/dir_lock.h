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

namespace shardsim::inline common {

class DirLock {
 public:
  DirLock(const std::string& dir, const std::string& holder_text);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// The same lock on one output file (a training checkpoint that several saves replace: two `train --checkpoint X`
// at once would each rename their own saves over X). FileLock(target, "--checkpoint", "train c.yaml") locks
// DIR/.NAME.lock beside TARGET (TARGET's directory and file name, after resolve_output: a symlink's target),
// held until destroyed; the lock file is removed then (a locker re-checks after flock that the name still holds
// the file it locked, so the removal never lets two hold it). Another holder: UsageError (exit 2) naming FLAG, the
// file and the holder; a dying holder is waited for as DirLock's.
class FileLock {
 public:
  FileLock(const std::string& target, const std::string& flag, const std::string& holder_text);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  std::string file_;
  int fd_ = -1;
};

}  // namespace shardsim::common
