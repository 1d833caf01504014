// Helpers for tests that start real processes: a child process that never outlives its
// test, waits with deadlines, and a scratch directory under /tmp.
//
// Thread safety: a ChildProcess is used by one thread at a time; TempDir is immutable
// after construction.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include "common/status.h"

namespace ps::itest {

using Deadline = std::chrono::steady_clock::time_point;

// A deadline `timeout` from now.
Deadline DeadlineIn(std::chrono::milliseconds timeout);

// The path of binary `name` (ps_coordinator, ps_server, ps_worker): in $PS_BIN_DIR when set
// (ctest sets it), else in the build's bin folder this test was compiled for.
std::string BinaryPath(const std::string& name);

// The repository root: $PS_SOURCE_DIR when set, else the source tree this test was built
// from.
std::string SourceDir();

class ChildProcess;

// Waits until `path` exists and is not empty, or `deadline` passes (DeadlineExceeded).
// When `watch` is given and that process exits first, fails at once with Unavailable
// instead of waiting out the deadline for a file that will never come.
Status WaitForFile(const std::string& path, Deadline deadline, ChildProcess* watch = nullptr);

// A child process (fork + exec). It leads a process group of its own, so that Kill() also
// ends whatever it started (a launch script's servers and workers). The destructor kills
// and reaps it, so a failed assertion never leaves processes behind; and the child gets
// `parent_death_signal` when the thread that spawned it dies, so a test that crashes or is
// killed by ctest's timeout leaves none either. Spawn from a thread that outlives the child
// (the test's main thread).
class ChildProcess {
 public:
  // Starts `argv[0]` (a path) with `argv`, stdin from /dev/null, stdout and stderr appended
  // to `log_path`. Unavailable when it cannot be executed. For a script that stops its own
  // children on SIGTERM, pass SIGTERM so that it can; 0 for no parent-death signal.
  static Result<ChildProcess> Spawn(const std::vector<std::string>& argv,
                                    const std::string& log_path, int parent_death_signal = SIGKILL);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // Whether it has been reaped (by WaitExit, TryReap or Kill).
  bool exited() const { return exited_; }

  // Waits until the process exits or `deadline` passes. Returns its exit status (0-255),
  // or 128 + N when signal N ended it; DeadlineExceeded when still running at the deadline
  // (it is left running). After an exit, later calls return the same status.
  Result<int> WaitExit(Deadline deadline);

  // Reaps the process if it has exited, without blocking. True when it has.
  bool TryReap();

  // SIGKILLs the process group (the process and whatever it started) and reaps the
  // process. Safe to call more than once.
  void Kill();

 private:
  friend Status WaitForFile(const std::string& path, Deadline deadline, ChildProcess* watch);

  ChildProcess() = default;
  void Reset();
  // Records a waitpid status.
  void SetExit(int wait_status);

  pid_t pid_ = -1;
  int pidfd_ = -1;  // -1 where pidfd_open is unavailable; then WaitExit polls
  bool exited_ = false;
  bool group_killed_ = false;
  int exit_status_ = 0;
  std::string log_path_;
};

// Reads a whole file; NotFound when it cannot be opened.
Result<std::string> ReadFile(const std::string& path);

// The last `lines` lines of a file (for failure messages); empty when unreadable.
std::string TailOfFile(const std::string& path, int lines);

// A fresh directory under /tmp, removed with everything in it on destruction.
class TempDir {
 public:
  // Creates /tmp/<prefix>XXXXXX. Fails the process (CHECK) when /tmp is unusable: nothing
  // a test could do would help.
  explicit TempDir(const std::string& prefix = "ps_test_");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A process found by ScanProcesses.
struct ProcessInfo {
  pid_t pid = 0;
  pid_t pgid = 0;
  char state = '?';     // from /proc/PID/stat: R, S, D, Z (zombie), ...
  std::string comm;     // the executable name, at most 15 characters
  std::string cmdline;  // arguments joined by spaces (empty for zombies)
};

// Every live process of this machine (as far as /proc shows them), except this one.
std::vector<ProcessInfo> ScanProcesses();

}  // namespace ps::itest
