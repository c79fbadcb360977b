// shardsim error hierarchy and the CLI exit codes they map to.
//
// Every error carries the context a user needs to act on it: the config file and line for bad input,
// the chip (rank) and op for runtime faults. The CLI maps each class to one exit code:
//   0 ok, 1 validation failed, 2 bad input or usage (ConfigError, UsageError), 3 runtime fault (RuntimeFault).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace shardsim::inline common {

enum ExitCode : int {
  kExitOk = 0,
  kExitValidationFailed = 1,
  kExitBadInput = 2,
  kExitRuntimeFault = 3,
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  virtual int exit_code() const noexcept = 0;
};

// Bad input: a config file that is missing, malformed, has unknown keys or invalid values.
// The message starts with "FILE:LINE:" when the location is known.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what) {}
  int exit_code() const noexcept override { return kExitBadInput; }
};

// Bad command-line usage or an impossible request (e.g. shapes that do not fit a plan).
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what) {}
  int exit_code() const noexcept override { return kExitBadInput; }
};

// Bad input found once the run is set up (e.g. a named parallel.algorithm that cannot run on a group of the
// mesh): KEY is the config key that caused it ("parallel.algorithm"), so the command can name its FILE:LINE
// (ConfigNode::fail at that key); elsewhere it is a UsageError naming the key in its message.
class ConfigKeyError : public UsageError {
 public:
  ConfigKeyError(std::string key, const std::string& what) : UsageError(what), key_(std::move(key)) {}
  const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

// A fault while running: MPI failure, I/O failure, internal invariant. The message names chip and op.
class RuntimeFault : public Error {
 public:
  explicit RuntimeFault(const std::string& what) : Error(what) {}
  int exit_code() const noexcept override { return kExitRuntimeFault; }
};

// An error every rank already knows about (the ranks agreed on it collectively): each rank exits with
// exit_code() through MPI_Finalize and only rank 0 prints the message, once.
class AgreedError : public Error {
 public:
  AgreedError(const std::string& what, int code) : Error(what), code_(code) {}
  int exit_code() const noexcept override { return code_; }

 private:
  int code_;
};

}  // namespace shardsim::common
