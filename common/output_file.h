// Safe output files: every file shardsim writes (reports, traces, CSV, JSON, plot scripts, checkpoints) lands
// through this module, so a reader never sees a half file and every write error is reported.
//
// The recipe (see docs/RELIABILITY.md for the promises and the tests that check them):
//   1. a temporary next to the target, created EXCLUSIVELY: "PATH.partial.p<PID>h<HOST>.XXXXXX" (the writer's
//      process id, a hash of its host name, a random suffix), O_CREAT|O_EXCL|O_NOFOLLOW, so a file or symlink
//      planted under any predictable name is never opened, followed or truncated; its mode is 0666 minus the
//      umask, like a plain open(2). Temporaries of writers that died without cleaning up (kill -9) are swept by
//      the next writer of the same PATH on the same host (sweep_stale_temps);
//   2. every write(2) checked (short writes retried, EINTR retried), then fsync(2) and close(2) checked;
//   3. rename(2) over PATH (atomic on POSIX file systems: PATH is the old file or the new one, never a mix),
//      then fsync of PATH's directory so the rename itself is durable.
// On any failure the temporary is removed and RuntimeFault (exit 3) is thrown with ONE line naming PATH and the
// cause in the C library's words, e.g. "cannot write out/results.csv: No space left on device".
//
// Where the bytes go (resolve_output, before any work): a new path or a regular file is replaced atomically; a
// symlink whose final target is a regular file has that TARGET replaced atomically (the link itself stays); the
// file this process's standard output or error is (/dev/stdout, /dev/fd/1, or `--json out.txt > out.txt`) is
// written through that descriptor, in order with what the command prints; a FIFO or pipe (directly or through
// symlinks: `--json >(gzip >x)`), /dev/null, /dev/zero and terminals are opened and written through (/dev/full,
// where every write fails, is refused).
// A block device, a socket, any other character device (never opened: some act when opened), a dangling symlink
// or a FIFO without a reader is refused (UsageError, exit 2). So a path never replaces what it points at:
// `--csv /dev/stdout` leaves the system's /dev/stdout link as it was.
//
// Two outputs are "the same file" when their output_identity() is equal: realpath(parent directory) + "/" +
// basename of the file that is replaced (a symlink's target). That works before either file exists.
//
// No MPI here: in a parallel job exactly one rank writes each output (checkpoints use the helpers below for
// their temporary name and the final rename, see checkpoint/checkpoint.h).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardsim::inline common {

// realpath(dirname(PATH)) + "/" + basename(PATH). UsageError (exit 2) naming FLAG when the directory does not
// exist or PATH names a directory-like entry ("", ".", "..", ending in '/').
std::string output_identity(const std::string& path, const std::string& flag = "output");

// Where an output's bytes go (see above). STREAM: written through (STD_FD 1 or 2: this process's standard output
// or error; -1: PATH is opened for writing); otherwise PATH is the file to replace atomically (the path given, or
// a symlink's final target). UsageError naming FLAG for what cannot be written (see above).
struct OutputTarget {
  bool stream = false;
  int std_fd = -1;
  std::string path;
};
OutputTarget resolve_output(const std::string& path, const std::string& flag);

// The regular file to replace for an output that must be a file (a checkpoint: HDF5 needs to seek): a stream
// (/dev/stdout, /dev/null, a FIFO) is UsageError naming FLAG; otherwise resolve_output's path.
std::string resolve_file_output(const std::string& path, const std::string& flag);

// UsageError (exit 2) naming FLAG when PATH exists and is neither a regular file, a symlink nor a directory:
// rename(2) would replace a device node, FIFO or socket with a plain file. commit_temp checks it as the last line
// of defence for the resolved file it replaces.
void check_replaceable(const std::string& path, const std::string& flag);

// Every output of one command, checked before any work: not empty, not an existing directory, its directory a
// writable directory (an output "under" a regular file is refused here, not after the run) where its temporary can
// be created now (/proc, /sys, a name too long with the temporary's suffix), an existing file writable, no two with
// the same output_identity, and none the same file as one of INPUTS (realpath, e.g. the config); streams (above)
// are checked to be writable now (a FIFO is opened here and kept open for the write, so one without a reader is
// refused before the run), and no two write one stream (the same inode: `--json /dev/stdout --trace /dev/fd/1`;
// /dev/null and /dev/zero excepted). UsageError (exit 2) naming the flags otherwise.
// When an output writes to standard output, the text the command prints from then on goes to standard error
// (dup2; the outputs keep the original descriptor), so standard output holds that output alone.
void check_outputs_distinct(const std::vector<std::pair<std::string, std::string>>& flag_and_path,
                            const std::vector<std::pair<std::string, std::string>>& flag_and_input = {});

// The outputs checked above are remembered for the process, and so is every input file read through
// read_input_file (configs and the topology, device and workload files they name, request traces, logs, tables,
// import sources): an output that is (the same inode as) an input read before, or an input read after its file was
// named as an output (a config's `topology: t.yaml` under `--json t.yaml`), is UsageError naming the flag and the
// input, before any work. NOTE_INPUT records PATH (WHAT: "a config file") and throws that UsageError.
void note_input(const std::string& path, const std::string& what);

// DIR and its missing parents created (mode 0777 minus the umask), each with mkdir(2), so a failure names the
// real cause ("Read-only file system", "Not a directory", "File name too long"; std::filesystem said "No such
// file or directory" on a read-only file system). Returns "" or the cause of the first directory that could not
// be made; an existing directory is fine.
std::string make_output_dir(const std::string& dir);

// "PATH.partial.p<PID>h<HOST>.XXXXXX" created exclusively (see above); the descriptor is open for writing.
// RuntimeFault.
struct TempFile {
  int fd = -1;
  std::string name;
};
TempFile create_temp_for(const std::string& path);

// A fresh name "PATH.partial.p<PID>h<HOST>.XXXXXX" (random suffix) that does not exist yet, for a caller that
// creates the file itself with O_CREAT|O_EXCL (the checkpoint writer: H5Fcreate with H5F_ACC_EXCL).
std::string temp_name_for(const std::string& path);

// "p<PID>h<HOST>": this process's id and an 8-hex-digit FNV-1a hash of gethostname(2), as temp names carry it.
std::string temp_owner_tag();

// Removes the temporaries of PATH left by writers that are gone: every plain file in PATH's directory named
// "BASENAME.partial.p<PID>h<HOST>.*" (with ".space" companions) whose HOST is this host and whose PID no longer
// exists (kill(PID, 0) fails with ESRCH). Never touches another host's, a live process's, a symlink or an
// old-style name without an owner (a reused PID keeps a stale file: conservative). Returns the removed paths.
// Errors (unreadable directory) are ignored: the write that follows reports them. The sweep is a directory scan.
std::vector<std::string> sweep_stale_temps(const std::string& path);

// fsync(TEMP) (when FSYNC_TEMP), rename(TEMP, PATH), fsync(PATH's directory). On failure TEMP is removed and
// RuntimeFault names PATH and the cause.
void commit_temp(const std::string& temp, const std::string& path, bool fsync_temp = true);

// An output written in one piece: create, write(), commit(). Destroyed without commit() (an exception, an
// early return): the temporary is closed and removed, PATH is untouched. A stream target (resolve_output) is
// written through as write() is called (nothing to roll back there).
class OutputFile {
 public:
  explicit OutputFile(std::string path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  void write(std::string_view data);
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  OutputTarget target_;
  TempFile tmp_;  // file targets; for a stream, tmp_.fd is the descriptor written through
  bool committed_ = false;
};

// Temporaries in flight, so a signal handler can remove them (the final names are never half written anyway;
// this only avoids leaving PATH.partial.XXXXXX behind). OutputFile and the checkpoint writer register theirs.
void register_temp(const std::string& name);
void unregister_temp(const std::string& name);
// Async-signal-safe: unlink(2) every registered temporary. Callable from a handler on any thread.
void unlink_registered_temps() noexcept;
// Register a temporary BEFORE creating it, call this right after creating it, and unregister it only after
// removing or renaming it: then a handler running unlink_registered_temps on another thread at any moment
// still removes it (if the handler already ran, this removes NAME and waits for the process to end).
void settle_registered_temp(const std::string& name) noexcept;

// OutputFile in one call.
void write_file_atomic(const std::string& path, std::string_view text);

// An output that grows row by row and must survive an interruption with every finished row (bench --csv,
// sweep results.csv): each append() lands the whole content so far atomically, so PATH always holds a complete
// prefix of the rows. Cost: the file is rewritten per row (fine for the hundreds of rows these outputs have).
// A stream target (/dev/stdout, a pipe) gets each new part once instead.
class GrowingOutput {
 public:
  GrowingOutput() = default;
  explicit GrowingOutput(std::string path, std::string head = "") : path_(std::move(path)), text_(std::move(head)) {}
  void reset(std::string path, std::string head) {
    path_ = std::move(path);
    text_ = std::move(head);
    landed_ = 0;
  }
  void land() const;
  void append(const std::string& rows) {
    text_ += rows;
    land();
  }
  const std::string& text() const { return text_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, text_;
  mutable size_t landed_ = 0;  // bytes of text_ already written to a stream target
};

}  // namespace shardsim::common
