#include "tests/integration/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

extern char** environ;

namespace ps::itest {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Where pidfd_open (Linux 5.3) is missing or filtered, waits fall back to polling at this
// interval: the only place these helpers sleep.
constexpr std::chrono::milliseconds kFallbackPoll{20};

std::string ErrnoText(const std::string& what, int err) { return what + ": " + std::strerror(err); }

// Milliseconds left until `deadline`, clamped to [0, cap] for poll(2).
int MillisLeft(Deadline deadline, std::chrono::milliseconds cap) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  left = std::clamp(left, std::chrono::milliseconds(0), cap);
  return static_cast<int>(left.count());
}

bool NonEmptyFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
}

}  // namespace

Deadline DeadlineIn(std::chrono::milliseconds timeout) { return SteadyClock::now() + timeout; }

std::string BinaryPath(const std::string& name) {
  const char* dir = std::getenv("PS_BIN_DIR");
#ifdef PS_DEFAULT_BIN_DIR
  if (dir == nullptr || *dir == '\0') dir = PS_DEFAULT_BIN_DIR;
#endif
  if (dir == nullptr) dir = "build/bin";
  return std::string(dir) + "/" + name;
}

std::string SourceDir() {
  const char* dir = std::getenv("PS_SOURCE_DIR");
#ifdef PS_DEFAULT_SOURCE_DIR
  if (dir == nullptr || *dir == '\0') dir = PS_DEFAULT_SOURCE_DIR;
#endif
  if (dir == nullptr) dir = ".";
  return dir;
}

// ---- ChildProcess ----

Result<ChildProcess> ChildProcess::Spawn(const std::vector<std::string>& argv,
                                         const std::string& log_path, int parent_death_signal) {
  if (argv.empty()) return InvalidArgument("ChildProcess::Spawn needs a program");
  // Everything the child needs is prepared here: between fork and exec a multithreaded
  // parent's child may only make async-signal-safe calls (no allocation).
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return Unavailable(ErrnoText("cannot open " + log_path, errno));
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  // The child writes exec's errno here; a successful exec closes it (CLOEXEC) unwritten.
  int status_pipe[2] = {-1, -1};
  if (null_fd < 0 || pipe2(status_pipe, O_CLOEXEC) != 0) {
    Status e = Internal(ErrnoText("cannot set up the child's files", errno));
    close(log_fd);
    if (null_fd >= 0) close(null_fd);
    return e;
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    // Its own process group (pgid = its pid), so that Kill() reaches its descendants.
    setpgid(0, 0);
    // Dies with the test even when the test is killed or crashes and no destructor runs.
    if (parent_death_signal != 0) prctl(PR_SET_PDEATHSIG, parent_death_signal);
    if (getppid() != parent) _exit(127);  // the test died before prctl took effect
    dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    // Default signal handling with nothing blocked, whatever gtest or ctest set up here.
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP, SIGQUIT})
      sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(args[0], args.data(), environ);
    int err = errno;
    ssize_t n = write(status_pipe[1], &err, sizeof(err));
    (void)n;
    _exit(127);
  }
  int fork_errno = errno;
  close(status_pipe[1]);
  close(log_fd);
  close(null_fd);
  if (pid < 0) {
    close(status_pipe[0]);
    return Unavailable(ErrnoText("fork for " + argv[0], fork_errno));
  }
  setpgid(pid, pid);  // also from here, so the group exists before Spawn returns
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(status_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(status_pipe[0]);
  if (n > 0) {
    int ignored;
    waitpid(pid, &ignored, 0);
    return Unavailable(ErrnoText("cannot start " + argv[0], exec_errno));
  }

  ChildProcess child;
  child.pid_ = pid;
  child.log_path_ = log_path;
  long fd = syscall(SYS_pidfd_open, pid, 0);
  child.pidfd_ = fd >= 0 ? static_cast<int>(fd) : -1;
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept { *this = std::move(other); }

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Kill();
    Reset();
    pid_ = std::exchange(other.pid_, -1);
    pidfd_ = std::exchange(other.pidfd_, -1);
    exited_ = other.exited_;
    group_killed_ = other.group_killed_;
    exit_status_ = other.exit_status_;
    log_path_ = std::move(other.log_path_);
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  Kill();
  Reset();
}

void ChildProcess::Reset() {
  if (pidfd_ >= 0) close(pidfd_);
  pidfd_ = -1;
  pid_ = -1;
}

void ChildProcess::SetExit(int wait_status) {
  exited_ = true;
  if (WIFEXITED(wait_status)) {
    exit_status_ = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    exit_status_ = 128 + WTERMSIG(wait_status);
  } else {
    exit_status_ = 255;
  }
}

bool ChildProcess::TryReap() {
  if (pid_ < 0 || exited_) return exited_;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    SetExit(status);
  } else if (r < 0 && errno == ECHILD) {
    // Reaped elsewhere (nothing in these tests does that); treat it as gone.
    exited_ = true;
    exit_status_ = 255;
  }
  return exited_;
}

Result<int> ChildProcess::WaitExit(Deadline deadline) {
  if (pid_ < 0) return FailedPrecondition("no process");
  while (!TryReap()) {
    if (SteadyClock::now() >= deadline) {
      return DeadlineExceeded("process " + std::to_string(pid_) + " (log " + log_path_ +
                              ") still running at the deadline");
    }
    if (pidfd_ >= 0) {
      // A pidfd becomes readable when the process exits: block on it until the deadline.
      pollfd p{pidfd_, POLLIN, 0};
      int n = poll(&p, 1, MillisLeft(deadline, std::chrono::hours(1)));
      if (n < 0 && errno != EINTR) return Internal(ErrnoText("poll on pidfd", errno));
    } else {
      std::this_thread::sleep_for(std::min<SteadyClock::duration>(
          kFallbackPoll, std::max<SteadyClock::duration>(deadline - SteadyClock::now(),
                                                         SteadyClock::duration::zero())));
    }
  }
  return exit_status_;
}

void ChildProcess::Kill() {
  if (pid_ < 0) return;
  if (!group_killed_) {
    // The group is this child's own (it was started as its leader), so this reaches only
    // the processes this test started. ESRCH: the group is already empty.
    killpg(pid_, SIGKILL);
    group_killed_ = true;
  }
  if (!exited_) {
    kill(pid_, SIGKILL);
    int status = 0;
    pid_t r;
    do {
      r = waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    if (r == pid_) {
      SetExit(status);
    } else {
      exited_ = true;
      exit_status_ = 255;
    }
  }
}

// ---- files ----

Status WaitForFile(const std::string& path, Deadline deadline, ChildProcess* watch) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  // Watch the directory before the first look, so that a file made in between still wakes
  // us. Without inotify, fall back to polling.
  int ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (ino >= 0 && inotify_add_watch(ino, dir.c_str(),
                                    IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_MODIFY) < 0) {
    close(ino);
    ino = -1;
  }
  Status outcome;
  while (true) {
    if (NonEmptyFile(path)) break;
    if (watch != nullptr && watch->TryReap()) {
      outcome = Unavailable("process " + std::to_string(watch->pid()) + " exited before writing " +
                            path + " (log " + watch->log_path() + ")");
      break;
    }
    if (SteadyClock::now() >= deadline) {
      outcome = DeadlineExceeded(path + " did not appear in time");
      break;
    }
    std::vector<pollfd> fds;
    if (ino >= 0) fds.push_back({ino, POLLIN, 0});
    if (watch != nullptr && watch->pidfd_ >= 0) fds.push_back({watch->pidfd_, POLLIN, 0});
    bool blocking = ino >= 0 && (watch == nullptr || watch->pidfd_ >= 0);
    int wait_ms = MillisLeft(deadline, blocking ? std::chrono::hours(1) : kFallbackPoll);
    int n = poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno != EINTR) {
      outcome = Internal(ErrnoText("poll", errno));
      break;
    }
    if (ino >= 0) {
      // Drain the events; what they say does not matter, the loop looks again.
      alignas(inotify_event) char buf[4096];
      while (read(ino, buf, sizeof(buf)) > 0) {
      }
    }
  }
  if (ino >= 0) close(ino);
  return outcome;
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TailOfFile(const std::string& path, int lines) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const std::string& l : last) out += l + "\n";
  return out;
}

// ---- TempDir ----

TempDir::TempDir(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  CHECK(mkdtemp(buf.data()) != nullptr) << ErrnoText("mkdtemp " + pattern, errno);
  path_ = buf.data();
}

TempDir::~TempDir() {
  // PS_KEEP_TEST_DIRS=1 keeps every test's directory (its processes' logs) for a post-mortem.
  if (const char* keep = std::getenv("PS_KEEP_TEST_DIRS"); keep != nullptr && keep[0] == '1') {
    std::fprintf(stderr, "kept %s (PS_KEEP_TEST_DIRS=1)\n", path_.c_str());
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) LOG(WARNING) << "could not remove " << path_ << ": " << ec.message();
}

// ---- /proc ----

std::vector<ProcessInfo> ScanProcesses() {
  std::vector<ProcessInfo> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  const pid_t self = getpid();
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 0 || pid == self) continue;
    std::string base = std::string("/proc/") + e->d_name;
    Result<std::string> stat = ReadFile(base + "/stat");
    if (!stat.ok()) continue;  // exited while we looked
    // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parentheses, so split at
    // the last ')'.
    const std::string& s = *stat;
    size_t open = s.find('('), close_paren = s.rfind(')');
    if (open == std::string::npos || close_paren == std::string::npos || close_paren < open) {
      continue;
    }
    ProcessInfo info;
    info.pid = static_cast<pid_t>(pid);
    info.comm = s.substr(open + 1, close_paren - open - 1);
    std::istringstream rest(s.substr(close_paren + 1));
    long ppid = 0, pgid = 0;
    rest >> info.state >> ppid >> pgid;
    info.pgid = static_cast<pid_t>(pgid);
    Result<std::string> cmdline = ReadFile(base + "/cmdline");
    if (cmdline.ok()) {
      info.cmdline = *cmdline;
      std::replace(info.cmdline.begin(), info.cmdline.end(), '\0', ' ');
    }
    out.push_back(std::move(info));
  }
  closedir(proc);
  return out;
}

}  // namespace ps::itest
